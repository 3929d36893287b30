// Token files in the llm.c / nanoGPT .bin layout: a header of 256 int32 (magic 20240520, version 1,
// token count), then uint16 tokens. Batches are positioned by step, so every layout and every
// resumed run reads the same tokens for the same step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::runtime {

inline constexpr int32_t kTokenFileMagic = 20240520;

class TokenFile {
 public:
  static Result<TokenFile> Open(const std::string& path);
  size_t size() const { return tokens_.size(); }
  int max_token() const { return max_token_; }
  // Sequences [first, first+count) of the step's global batch: inputs and next-token targets,
  // each count*seq tokens.
  void Batch(int64_t step, int64_t global_batch, int64_t first, int64_t count, int seq,
             std::vector<int32_t>* inputs, std::vector<int32_t>* targets) const;

 private:
  std::vector<uint16_t> tokens_;
  int max_token_ = 0;
};

// Byte-level tokens (vocab 256) of `text_path` written to `out_path`; returns the token count.
Result<int64_t> PrepareByteTokens(const std::string& text_path, const std::string& out_path);

}  // namespace megascope::runtime
