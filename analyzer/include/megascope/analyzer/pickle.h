// A data-only reader of Python pickles (protocols 0-5): what PyTorch's Flight Recorder writes when
// TORCH_NCCL_DUMP_ON_TIMEOUT fires (torch::jit::pickle, protocol 2, of dicts, lists, tuples,
// strings, ints, floats, bools and None) and what Python's pickle.dump writes for the same data.
// Nothing is ever looked up, constructed or called: opcodes that would (GLOBAL, REDUCE, BUILD,
// NEWOBJ, INST, OBJ, PERSID, EXT...) are refused with the opcode and its byte offset. The
// exceptions are TorchScript's wrappers, which only label plain data and are read as it:
// torch.jit._pickle.restore_type_tag(value, "Dict[str, Any]") around every dict and list the jit
// pickler writes, and build_intlist / build_doublelist / build_boollist around typed lists. Memo
// references are shared, as in Python; nesting deeper than 100 or an expansion larger than a fixed
// multiple of the input is refused rather than followed.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "megascope/tracer/status.h"

namespace megascope::analyzer {

// The pickled value as JSON: tuples, sets and lists become arrays, bytes become strings, dict keys
// that are not strings are written as their JSON text (an int key 3 becomes "3").
Result<nlohmann::json> ReadPickle(std::string_view bytes);

// True when `bytes` opens like a pickle of protocol 2 or later (PROTO opcode).
bool LooksLikePickle(std::string_view bytes);

}  // namespace megascope::analyzer
