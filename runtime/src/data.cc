#include "megascope/runtime/data.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"

namespace megascope::runtime {

Result<TokenFile> TokenFile::Open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open token file " + path);
  int32_t header[256];
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return DataLoss(path + " is too short for a token file header (1024 bytes)");
  }
  if (header[0] != kTokenFileMagic) {
    return InvalidArgument(path + " is not a token file (magic " + std::to_string(header[0]) +
                           ", expected " + std::to_string(kTokenFileMagic) +
                           "; make one with 'megascope prepare-data')");
  }
  if (header[1] != 1)
    return InvalidArgument(path + ": token file version " + std::to_string(header[1]) +
                           " is not supported");
  const int64_t count = header[2];
  TokenFile f;
  f.tokens_.resize(static_cast<size_t>(std::max<int64_t>(count, 0)));
  in.read(reinterpret_cast<char*>(f.tokens_.data()),
          static_cast<std::streamsize>(f.tokens_.size() * 2));
  if (in.gcount() != static_cast<std::streamsize>(f.tokens_.size() * 2)) {
    return DataLoss(path + " is truncated: header says " + std::to_string(count) +
                    " tokens, file holds " + std::to_string(in.gcount() / 2));
  }
  for (uint16_t t : f.tokens_) f.max_token_ = std::max<int>(f.max_token_, t);
  return f;
}

void TokenFile::Batch(int64_t step, int64_t global_batch, int64_t first, int64_t count, int seq,
                      std::vector<int32_t>* inputs, std::vector<int32_t>* targets) const {
  inputs->resize(static_cast<size_t>(count * seq));
  targets->resize(static_cast<size_t>(count * seq));
  const int64_t span = static_cast<int64_t>(tokens_.size()) - seq - 1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = ((step * global_batch + first + i) * seq) % span;
    for (int t = 0; t < seq; ++t) {
      (*inputs)[i * seq + t] = tokens_[start + t];
      (*targets)[i * seq + t] = tokens_[start + t + 1];
    }
  }
}

Result<int64_t> PrepareByteTokens(const std::string& text_path, const std::string& out_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return NotFound("cannot open " + text_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() < 2) return InvalidArgument(text_path + " holds too little text to train on");
  std::string out(1024 + text.size() * 2, '\0');
  int32_t header[256] = {kTokenFileMagic, 1, static_cast<int32_t>(text.size())};
  std::memcpy(out.data(), header, sizeof(header));
  for (size_t i = 0; i < text.size(); ++i) {
    const uint16_t t = static_cast<unsigned char>(text[i]);
    std::memcpy(out.data() + 1024 + 2 * i, &t, 2);
  }
  RETURN_IF_ERROR(tracer::WriteFileAtomic(out_path, out));
  return static_cast<int64_t>(text.size());
}

}  // namespace megascope::runtime
