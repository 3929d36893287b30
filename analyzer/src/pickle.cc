// The pickle virtual machine, data opcodes only (pickletools.py documents each opcode; PyTorch's
// torch/csrc/jit/serialization/pickler.cpp is the writer of the Flight Recorder's dumps).
#include "megascope/analyzer/pickle.h"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "megascope/tracer/format.h"

namespace megascope::analyzer {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 100;

// A value on the stack or in the memo. Containers live in the arena and are shared by index, so
// a memo reference is the same object (as in Python) and nothing is copied while reading.
struct Value {
  enum Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kList, kDict, kMark, kGlobal };
  Kind kind = kNone;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;   // kStr: the text; kGlobal: "module.name"
  uint32_t c = 0;  // kList / kDict: arena index
};

Value Of(Value::Kind kind) {
  Value v;
  v.kind = kind;
  return v;
}

struct Container {
  std::vector<Value> items;  // a dict holds key, value, key, value, ...
};

class Machine {
 public:
  explicit Machine(std::string_view in) : in_(in) {}

  Result<json> Run() {
    while (pos_ < in_.size()) {
      const size_t at = pos_;
      const auto op = static_cast<uint8_t>(in_[pos_++]);
      Status st = Step(op, at);
      if (!st.ok()) return st;
      if (stopped_) break;
    }
    if (!stopped_)
      return InvalidArgument("pickle ends at byte " + std::to_string(pos_) +
                             " without its STOP opcode (truncated?)");
    if (stack_.empty() || stack_.back().kind == Value::kMark)
      return InvalidArgument("pickle stops with no value on its stack");
    budget_ = 64 * in_.size() + 4096;
    json out;
    RETURN_IF_ERROR(ToJson(stack_.back(), 0, &out));
    return out;
  }

 private:
  static std::string Hex(uint8_t op) { return tracer::Format("0x%02x", op); }
  Status Bad(size_t at, const std::string& what) const {
    return InvalidArgument("pickle byte " + std::to_string(at) + ": " + what);
  }
  bool Take(size_t n, std::string_view* out) {
    if (n > in_.size() - pos_) return false;
    *out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool TakeLE(T* out) {  // little-endian integer
    std::string_view b;
    if (!Take(sizeof(T), &b)) return false;
    std::make_unsigned_t<T> u = 0;
    for (size_t k = sizeof(T); k-- > 0;)
      u = static_cast<decltype(u)>((u << 8) | static_cast<uint8_t>(b[k]));
    *out = static_cast<T>(u);
    return true;
  }
  bool TakeLine(std::string_view* out) {
    const size_t nl = in_.find('\n', pos_);
    if (nl == std::string_view::npos) return false;
    *out = in_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return true;
  }
  uint32_t NewContainer() {
    arena_.emplace_back();
    return static_cast<uint32_t>(arena_.size() - 1);
  }
  void Push(Value v) { stack_.push_back(std::move(v)); }
  void PushContainer(Value::Kind kind, std::vector<Value> items = {}) {
    Value v = Of(kind);
    v.c = NewContainer();
    arena_[v.c].items = std::move(items);
    Push(std::move(v));
  }
  // Pops everything above the topmost mark, and the mark.
  bool PopMark(std::vector<Value>* items) {
    size_t k = stack_.size();
    while (k > 0 && stack_[k - 1].kind != Value::kMark) --k;
    if (k == 0) return false;
    items->assign(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(k)),
                  std::make_move_iterator(stack_.end()));
    stack_.resize(k - 1);
    return true;
  }
  bool PopValue(Value* v) {
    if (stack_.empty() || stack_.back().kind == Value::kMark) return false;
    *v = std::move(stack_.back());
    stack_.pop_back();
    return true;
  }
  Status Memo(size_t at, uint64_t key) {
    if (stack_.empty()) return Bad(at, "memo store with an empty stack");
    memo_[key] = stack_.back();
    return Status::Ok();
  }
  Status Get(size_t at, uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Bad(at, "memo " + std::to_string(key) + " was never stored");
    Push(it->second);
    return Status::Ok();
  }
  Status Str(size_t at, uint64_t n) {
    std::string_view b;
    if (n > in_.size() || !Take(static_cast<size_t>(n), &b))
      return Bad(at, "string runs past the end");
    return Text(b);
  }
  // Each pushes one plain value.
  Status Text(std::string_view t) {
    Value v = Of(Value::kStr);
    v.s.assign(t);
    return Pushed(std::move(v));
  }
  Status Int(int64_t i) {
    Value v = Of(Value::kInt);
    v.i = i;
    return Pushed(std::move(v));
  }
  Status Float(double d) {
    Value v = Of(Value::kFloat);
    v.d = d;
    return Pushed(std::move(v));
  }
  Status Bool(bool b) {
    Value v = Of(Value::kBool);
    v.b = b;
    return Pushed(std::move(v));
  }
  Status Pushed(Value v) {
    Push(std::move(v));
    return Status::Ok();
  }
  // LONG1 / LONG4: little-endian two's complement of n bytes; beyond 64 bits read as a float.
  Status Long(size_t at, uint64_t n) {
    std::string_view b;
    if (n > in_.size() || !Take(static_cast<size_t>(n), &b))
      return Bad(at, "long runs past the end");
    if (n == 0) return Int(0);
    const bool negative = (static_cast<uint8_t>(b[n - 1]) & 0x80) != 0;
    if (n <= 8) {
      uint64_t u = negative ? ~uint64_t{0} : 0;
      for (size_t k = 0; k < n; ++k) {
        u &= ~(uint64_t{0xff} << (8 * k));
        u |= uint64_t{static_cast<uint8_t>(b[k])} << (8 * k);
      }
      return Int(static_cast<int64_t>(u));
    }
    double d = 0;
    for (size_t k = n; k-- > 0;) {
      const auto byte = static_cast<uint8_t>(b[k]);
      d = d * 256 + (negative ? 255 - byte : byte);
    }
    return Float(negative ? -(d + 1) : d);
  }
  // INT / LONG (protocol 0): a decimal line; INT's "01" and "00" are True and False.
  Status TextInt(size_t at, bool is_int) {
    std::string_view line;
    if (!TakeLine(&line)) return Bad(at, "integer line runs past the end");
    if (is_int && (line == "01" || line == "00")) return Bool(line == "01");
    if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
    const std::string text(line);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') return Bad(at, "'" + text + "' is not an integer");
    if (errno == ERANGE) return Float(std::strtod(text.c_str(), nullptr));
    return Int(x);
  }
  Status Tuple(size_t at, size_t n) {
    if (stack_.size() < n) return Bad(at, "tuple of " + std::to_string(n) + " with fewer values");
    std::vector<Value> items;
    for (size_t k = stack_.size() - n; k < stack_.size(); ++k) {
      if (stack_[k].kind == Value::kMark) return Bad(at, "tuple over a mark");
      items.push_back(std::move(stack_[k]));
    }
    stack_.resize(stack_.size() - n);
    PushContainer(Value::kList, std::move(items));
    return Status::Ok();
  }
  // The container under the values just popped (APPENDS, SETITEMS).
  Status Extend(size_t at, Value::Kind want, std::vector<Value> items) {
    if (stack_.empty() || stack_.back().kind != want)
      return Bad(at, want == Value::kDict ? "SETITEM(S) without a dict under it"
                                          : "APPEND(S) without a list under it");
    if (want == Value::kDict && items.size() % 2 != 0)
      return Bad(at, "SETITEMS with a key and no value");
    auto& dst = arena_[stack_.back().c].items;
    for (auto& v : items) dst.push_back(std::move(v));
    return Status::Ok();
  }
  Status Global(size_t at, const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    if (module != "torch.jit._pickle" || (name != "restore_type_tag" && name != "build_intlist" &&
                                          name != "build_doublelist" && name != "build_boollist")) {
      return Bad(at, "global '" + full +
                         "' would be looked up and called: refused (only plain data is read)");
    }
    Value v = Of(Value::kGlobal);
    v.s = full;
    return Pushed(std::move(v));
  }

  // The opcode switch (an exception to the function-size limit, named in .clang-tidy).
  // NOLINTNEXTLINE(readability-function-size)
  Status Step(uint8_t op, size_t at) {
    std::string_view b;
    switch (op) {
      case 0x80: {  // PROTO
        if (!Take(1, &b)) return Bad(at, "PROTO without its version");
        if (static_cast<uint8_t>(b[0]) > 5)
          return Bad(at, "pickle protocol " + std::to_string(static_cast<uint8_t>(b[0])) +
                             " is newer than this reader (protocols 0-5)");
        return Status::Ok();
      }
      case 0x95: {  // FRAME: a length hint
        uint64_t n;
        return TakeLE(&n) ? Status::Ok() : Bad(at, "FRAME without its length");
      }
      case '.':  // STOP
        stopped_ = true;
        return Status::Ok();
      case '(':  // MARK
        Push(Of(Value::kMark));
        return Status::Ok();
      case '0':  // POP
        if (stack_.empty()) return Bad(at, "POP with an empty stack");
        stack_.pop_back();
        return Status::Ok();
      case '1': {  // POP_MARK
        std::vector<Value> items;
        return PopMark(&items) ? Status::Ok() : Bad(at, "POP_MARK without a mark");
      }
      case '2':  // DUP
        if (stack_.empty()) return Bad(at, "DUP with an empty stack");
        Push(stack_.back());
        return Status::Ok();
      case 'N':  // NONE
        Push(Of(Value::kNone));
        return Status::Ok();
      case 0x88:  // NEWTRUE
      case 0x89:  // NEWFALSE
        return Bool(op == 0x88);
      case 'K': {  // BININT1
        uint8_t x;
        return TakeLE(&x) ? Int(x) : Bad(at, "BININT1 runs past the end");
      }
      case 'M': {  // BININT2
        uint16_t x;
        return TakeLE(&x) ? Int(x) : Bad(at, "BININT2 runs past the end");
      }
      case 'J': {  // BININT
        int32_t x;
        return TakeLE(&x) ? Int(x) : Bad(at, "BININT runs past the end");
      }
      case 0x8a: {  // LONG1
        uint8_t n;
        return TakeLE(&n) ? Long(at, n) : Bad(at, "LONG1 runs past the end");
      }
      case 0x8b: {  // LONG4
        int32_t n;
        if (!TakeLE(&n) || n < 0) return Bad(at, "LONG4 with a bad length");
        return Long(at, static_cast<uint64_t>(n));
      }
      case 'I':
      case 'L':
        return TextInt(at, op == 'I');
      case 'F': {  // FLOAT: a decimal line
        if (!TakeLine(&b)) return Bad(at, "FLOAT line runs past the end");
        const std::string text(b);
        char* end = nullptr;
        const double d = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return Bad(at, "'" + text + "' is not a float");
        return Float(d);
      }
      case 'G': {  // BINFLOAT: big-endian IEEE 754
        if (!Take(8, &b)) return Bad(at, "BINFLOAT runs past the end");
        uint64_t u = 0;
        for (int k = 0; k < 8; ++k) u = (u << 8) | static_cast<uint8_t>(b[k]);
        return Float(std::bit_cast<double>(u));
      }
      case 'X':    // BINUNICODE
      case 'T':    // BINSTRING
      case 'B': {  // BINBYTES
        uint32_t n;
        return TakeLE(&n) ? Str(at, n) : Bad(at, "string length runs past the end");
      }
      case 0x8c:   // SHORT_BINUNICODE
      case 'U':    // SHORT_BINSTRING
      case 'C': {  // SHORT_BINBYTES
        uint8_t n;
        return TakeLE(&n) ? Str(at, n) : Bad(at, "string length runs past the end");
      }
      case 0x8d:    // BINUNICODE8
      case 0x8e:    // BINBYTES8
      case 0x96: {  // BYTEARRAY8
        uint64_t n;
        return TakeLE(&n) ? Str(at, n) : Bad(at, "string length runs past the end");
      }
      case 'V':    // UNICODE: a raw-unicode-escape line, kept as written
      case 'S': {  // STRING: a quoted line, kept as written between its quotes
        if (!TakeLine(&b)) return Bad(at, "string line runs past the end");
        if (op == 'S') {
          if (b.size() < 2 || (b.front() != '\'' && b.front() != '"') || b.back() != b.front())
            return Bad(at, "STRING without its quotes");
          b = b.substr(1, b.size() - 2);
        }
        return Text(b);
      }
      case ')':   // EMPTY_TUPLE
      case ']':   // EMPTY_LIST
      case 0x8f:  // EMPTY_SET: a set of plain values reads as a list
        PushContainer(Value::kList);
        return Status::Ok();
      case '}':
        PushContainer(Value::kDict);
        return Status::Ok();
      case 0x85:
      case 0x86:
      case 0x87:
        return Tuple(at, static_cast<size_t>(op - 0x84));
      case 't':     // TUPLE
      case 'l':     // LIST
      case 0x91: {  // FROZENSET
        std::vector<Value> items;
        if (!PopMark(&items)) return Bad(at, "TUPLE/LIST without a mark");
        PushContainer(Value::kList, std::move(items));
        return Status::Ok();
      }
      case 'd': {  // DICT
        std::vector<Value> items;
        if (!PopMark(&items) || items.size() % 2 != 0)
          return Bad(at, "DICT without a mark or with a key and no value");
        PushContainer(Value::kDict, std::move(items));
        return Status::Ok();
      }
      case 'a': {  // APPEND
        Value v;
        if (!PopValue(&v)) return Bad(at, "APPEND without a value");
        return Extend(at, Value::kList, {std::move(v)});
      }
      case 's': {  // SETITEM
        Value v, k;
        if (!PopValue(&v) || !PopValue(&k)) return Bad(at, "SETITEM without a key and value");
        std::vector<Value> kv;
        kv.push_back(std::move(k));
        kv.push_back(std::move(v));
        return Extend(at, Value::kDict, std::move(kv));
      }
      case 'e':    // APPENDS
      case 0x90:   // ADDITEMS (to a set)
      case 'u': {  // SETITEMS
        std::vector<Value> items;
        if (!PopMark(&items)) return Bad(at, "APPENDS/SETITEMS without a mark");
        return Extend(at, op == 'u' ? Value::kDict : Value::kList, std::move(items));
      }
      case 'q': {  // BINPUT
        uint8_t k;
        return TakeLE(&k) ? Memo(at, k) : Bad(at, "BINPUT runs past the end");
      }
      case 'r': {  // LONG_BINPUT
        uint32_t k;
        return TakeLE(&k) ? Memo(at, k) : Bad(at, "LONG_BINPUT runs past the end");
      }
      case 0x94:  // MEMOIZE
        return Memo(at, memo_.size());
      case 'p':    // PUT
      case 'g': {  // GET
        if (!TakeLine(&b)) return Bad(at, "PUT/GET line runs past the end");
        const std::string text(b);
        char* end = nullptr;
        const unsigned long long k = std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0') return Bad(at, "memo key '" + text + "' is not a number");
        return op == 'p' ? Memo(at, k) : Get(at, k);
      }
      case 'h': {  // BINGET
        uint8_t k;
        return TakeLE(&k) ? Get(at, k) : Bad(at, "BINGET runs past the end");
      }
      case 'j': {  // LONG_BINGET
        uint32_t k;
        return TakeLE(&k) ? Get(at, k) : Bad(at, "LONG_BINGET runs past the end");
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string_view module, name;
        if (!TakeLine(&module) || !TakeLine(&name)) return Bad(at, "GLOBAL runs past the end");
        return Global(at, std::string(module), std::string(name));
      }
      case 0x93: {  // STACK_GLOBAL
        Value name, module;
        if (!PopValue(&name) || !PopValue(&module) || name.kind != Value::kStr ||
            module.kind != Value::kStr)
          return Bad(at, "STACK_GLOBAL without a module and a name");
        return Global(at, module.s, name.s);
      }
      case 'R': {  // REDUCE: only TorchScript's tag and list wrappers, read as their argument
        Value args, fn;
        if (!PopValue(&args) || !PopValue(&fn) || fn.kind != Value::kGlobal)
          return Bad(at, "REDUCE would call something: refused (only plain data is read)");
        // restore_type_tag(value, "Dict[str, Any]") -> value; build_intlist([1, 2]) -> [1, 2]
        const bool tag = fn.s == "torch.jit._pickle.restore_type_tag";
        if (args.kind != Value::kList || arena_[args.c].items.size() != (tag ? 2u : 1u) ||
            (!tag && arena_[args.c].items[0].kind != Value::kList))
          return Bad(at, fn.s + " applied to arguments it never takes");
        Push(arena_[args.c].items[0]);
        return Status::Ok();
      }
      default: {
        static const std::unordered_map<uint8_t, const char*> kRefused = {
            {'b', "BUILD"},      {'i', "INST"},   {'o', "OBJ"},          {0x81, "NEWOBJ"},
            {0x92, "NEWOBJ_EX"}, {'P', "PERSID"}, {'Q', "BINPERSID"},    {0x82, "EXT1"},
            {0x83, "EXT2"},      {0x84, "EXT4"},  {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}};
        auto it = kRefused.find(op);
        if (it != kRefused.end()) {
          return Bad(at, std::string("opcode ") + it->second +
                             " would construct an object or call code: refused (only plain "
                             "data is read)");
        }
        return Bad(at, "unknown opcode " + Hex(op) + " (not a pickle, or a corrupt one)");
      }
    }
  }

  Status ToJson(const Value& v, int depth, json* out) {
    if (depth > kMaxDepth)
      return InvalidArgument("pickle nests deeper than " + std::to_string(kMaxDepth) +
                             " (or refers to itself)");
    const uint64_t cost = 1 + v.s.size() / 16;
    if (cost > budget_)
      return InvalidArgument("pickle expands to far more data than its size: refused");
    budget_ -= cost;
    switch (v.kind) {
      case Value::kNone:
      case Value::kMark:
      case Value::kGlobal:
        *out = nullptr;
        return Status::Ok();
      case Value::kBool:
        *out = v.b;
        return Status::Ok();
      case Value::kInt:
        *out = v.i;
        return Status::Ok();
      case Value::kFloat:
        *out = v.d;
        return Status::Ok();
      case Value::kStr:
        // Bytes that are not UTF-8 would make the JSON unprintable; keep them readable.
        *out = json(v.s);
        return Status::Ok();
      case Value::kList: {
        *out = json::array();
        for (const Value& item : arena_[v.c].items) {
          json x;
          RETURN_IF_ERROR(ToJson(item, depth + 1, &x));
          out->push_back(std::move(x));
        }
        return Status::Ok();
      }
      case Value::kDict: {
        *out = json::object();
        const auto& items = arena_[v.c].items;
        for (size_t k = 0; k + 1 < items.size(); k += 2) {
          json key, value;
          RETURN_IF_ERROR(ToJson(items[k], depth + 1, &key));
          RETURN_IF_ERROR(ToJson(items[k + 1], depth + 1, &value));
          (*out)[key.is_string() ? key.get<std::string>()
                                 : key.dump(-1, ' ', false, json::error_handler_t::replace)] =
              std::move(value);
        }
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  std::string_view in_;
  size_t pos_ = 0;
  bool stopped_ = false;
  std::vector<Value> stack_;
  std::vector<Container> arena_;
  std::unordered_map<uint64_t, Value> memo_;
  uint64_t budget_ = 0;
};

}  // namespace

bool LooksLikePickle(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x80 &&
         static_cast<uint8_t>(bytes[1]) >= 2 && static_cast<uint8_t>(bytes[1]) <= 5;
}

Result<json> ReadPickle(std::string_view bytes) { return Machine(bytes).Run(); }

}  // namespace megascope::analyzer
