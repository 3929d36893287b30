#include "megascope/launch/state_files.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"

namespace megascope::launch {
namespace {

namespace fs = std::filesystem;
constexpr char kShardMagic[8] = {'M', 'S', 'C', 'K', 'P', 'T', '0', '1'};
constexpr size_t kHeader = 8 + 24;

bool ShardHeader(const std::string& bytes, int64_t* step, int64_t* rank, int64_t* n) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kShardMagic, 8) != 0) return false;
  int64_t h[3];
  std::memcpy(h, bytes.data() + 8, sizeof(h));
  *step = h[0];
  *rank = h[1];
  *n = h[2];
  return *n >= 0 && bytes.size() == kHeader + 3 * static_cast<size_t>(*n) * 4;
}

}  // namespace

uint64_t Fnv1a(const char* data, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ULL;
  return h;
}

std::string EncodeShard(int64_t step, int rank, size_t n, const std::vector<const float*>& arrays) {
  std::string out;
  out.reserve(kHeader + arrays.size() * n * 4);
  out.append(kShardMagic, 8);
  const int64_t header[3] = {step, rank, static_cast<int64_t>(n)};
  out.append(reinterpret_cast<const char*>(header), sizeof(header));
  for (const float* a : arrays) out.append(reinterpret_cast<const char*>(a), n * 4);
  return out;
}

Status DecodeShard(const std::string& bytes, const std::string& source, int64_t step, int rank,
                   size_t n, const std::vector<float*>& arrays) {
  int64_t s = 0, r = 0, count = 0;
  if (!ShardHeader(bytes, &s, &r, &count) || static_cast<size_t>(count) != n ||
      arrays.size() != 3) {
    return DataLoss(source + " does not match this model (" + std::to_string(n) +
                    " parameters on this rank)");
  }
  if (s != step || r != rank) {
    return DataLoss(source + " holds step " + std::to_string(s) + " of rank " + std::to_string(r) +
                    ", not step " + std::to_string(step) + " of rank " + std::to_string(rank));
  }
  const char* p = bytes.data() + kHeader;
  for (float* a : arrays) {
    std::memcpy(a, p, n * 4);
    p += n * 4;
  }
  return Status::Ok();
}

Status WriteShard(const std::string& path, const std::string& bytes, bool sync) {
  const std::string sum = std::to_string(Fnv1a(bytes.data(), bytes.size())) + "\n";
  if (sync) {
    RETURN_IF_ERROR(tracer::WriteFileAtomic(path, bytes));
    return tracer::WriteFileAtomic(path + ".sum", sum);
  }
  // Memory (tmpfs): rename for atomicity, no fsync (there is no disk under it).
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  for (const auto& [file, data] :
       {std::pair<std::string, const std::string*>{path, &bytes}, {path + ".sum", &sum}}) {
    const std::string tmp = file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(data->data(), static_cast<std::streamsize>(data->size()));
      if (!out) return IoError("cannot write " + tmp);
    }
    fs::rename(tmp, file, ec);
    if (ec) return IoError("cannot rename " + tmp + ": " + ec.message());
  }
  return Status::Ok();
}

Result<std::string> ReadShard(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound(path + " is missing");
  if (!fs::exists(path + ".sum", ec)) return DataLoss(path + " has no checksum (partial)");
  std::string bytes = tracer::ReadFile(path).value_or("");
  const std::string sum = tracer::ReadFile(path + ".sum").value_or("");
  if (std::to_string(Fnv1a(bytes.data(), bytes.size())) != sum.substr(0, sum.find('\n'))) {
    return DataLoss(path + " is corrupt (checksum mismatch)");
  }
  return bytes;
}

std::string MemoryShardName(int rank, int64_t step) {
  return "rank_" + std::to_string(rank) + ".step_" + std::to_string(step) + ".bin";
}

namespace {
// The rank and step of a memory shard's file name (MemoryShardName's, exactly: not its .sum).
bool ParseMemoryShardName(const std::string& name, int* rank, int64_t* step) {
  long long s = -1;
  if (std::sscanf(name.c_str(), "rank_%d.step_%lld", rank, &s) != 2 || *rank < 0 || s < 0)
    return false;
  *step = s;
  return name == MemoryShardName(*rank, *step);
}
}  // namespace

ResumePoint FindDiskCheckpoint(const RunLayout& layout, int world) {
  ResumePoint out;
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(layout.checkpoints(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0) steps.push_back(std::atoll(name.c_str() + 5));
  }
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t step : steps) {
    const std::string dir = layout.checkpoint(step);
    auto skip = [&](const std::string& why) {
      out.log += "[checkpoint] skipping step_" + std::to_string(step) + ": " + why + "\n";
    };
    if (!fs::exists(dir + "/manifest.json", ec)) {
      skip("no manifest (partial)");
      continue;
    }
    std::vector<std::string> files(world);
    bool ok = true;
    try {
      auto man = nlohmann::json::parse(tracer::ReadFile(dir + "/manifest.json").value_or(""));
      if (man.at("world") != world) {
        skip("written by a world of " + man.at("world").dump() + " ranks");
        continue;
      }
      for (const auto& s : man.at("shards")) {
        const int r = s.at("rank");
        const std::string path = dir + "/" + s.at("file").get<std::string>();
        const std::string bytes = tracer::ReadFile(path).value_or("");
        if (r < 0 || r >= world ||
            Fnv1a(bytes.data(), bytes.size()) != s.at("fnv1a64").get<uint64_t>()) {
          skip(s.at("file").get<std::string>() + " is corrupt (checksum mismatch)");
          ok = false;
          break;
        }
        files[r] = path;
      }
    } catch (const std::exception& e) {
      skip(std::string("unreadable manifest: ") + e.what());
      ok = false;
    }
    if (ok && std::find(files.begin(), files.end(), "") != files.end()) {
      skip("a rank's shard is not listed");
      ok = false;
    }
    if (!ok) continue;
    out.step = step;
    out.source = "disk";
    out.files = std::move(files);
    return out;
  }
  return out;
}

ResumePoint FindMemorySnapshot(const std::vector<std::string>& node_memory_dirs, int world) {
  ResumePoint out;
  // step -> rank -> candidate paths (own node first, then the buddy's copy)
  std::map<int64_t, std::map<int, std::vector<std::string>>, std::greater<>> found;
  std::error_code ec;
  for (const std::string& dir : node_memory_dirs) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      int rank = -1;
      int64_t step = -1;
      if (ParseMemoryShardName(e.path().filename().string(), &rank, &step) && rank < world)
        found[step][rank].push_back(e.path().string());
    }
  }
  for (auto& [step, ranks] : found) {
    if (static_cast<int>(ranks.size()) < world) {
      out.log += "[memory] step " + std::to_string(step) + ": shards of " +
                 std::to_string(ranks.size()) + " of " + std::to_string(world) + " ranks\n";
      continue;
    }
    std::vector<std::string> files(world);
    bool ok = true;
    for (auto& [rank, paths] : ranks) {
      for (const std::string& p : paths) {
        auto bytes = ReadShard(p);
        if (bytes.ok()) {
          files[rank] = p;
          break;
        }
        out.log += "[memory] " + bytes.status().message() + "\n";
      }
      if (files[rank].empty()) {
        out.log += "[memory] step " + std::to_string(step) + ": no valid shard of rank " +
                   std::to_string(rank) + "\n";
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    out.step = step;
    out.source = "memory";
    out.files = std::move(files);
    return out;
  }
  return out;
}

ResumePoint FindResumePoint(const RunLayout& layout,
                            const std::vector<std::string>& node_memory_dirs, int world) {
  ResumePoint mem = FindMemorySnapshot(node_memory_dirs, world);
  ResumePoint disk = FindDiskCheckpoint(layout, world);
  ResumePoint& best = mem.step >= disk.step && mem.step >= 0 ? mem : disk;
  best.log = mem.log + disk.log;
  return best;
}

Status WriteCheckpointManifest(const RunLayout& layout, int64_t step, int world, int wait_ms,
                               const std::atomic<bool>* stop) {
  const std::string dir = layout.checkpoint(step);
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  std::error_code ec;
  for (int r = 0; r < world; ++r) {
    const std::string f = dir + "/rank_" + std::to_string(r) + ".bin.sum";
    for (int waited = 0; waited < wait_ms && !fs::exists(f, ec) && !(stop && stop->load());
         waited += 50)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!fs::exists(f, ec)) {
      return NotFound("checkpoint step " + std::to_string(step) +
                      " incomplete: no shard from rank " + std::to_string(r));
    }
    const std::string sum = tracer::ReadFile(f).value_or("");
    uint64_t value = 0;
    if (std::sscanf(sum.c_str(), "%" SCNu64, &value) != 1)
      return DataLoss(f + " holds no checksum");
    files.push_back(
        {{"rank", r}, {"file", "rank_" + std::to_string(r) + ".bin"}, {"fnv1a64", value}});
  }
  nlohmann::ordered_json man = {{"format", "megascope-checkpoint"},
                                {"version", 1},
                                {"step", step},
                                {"world", world},
                                {"shards", files}};
  return tracer::WriteFileAtomic(dir + "/manifest.json", man.dump(1) + "\n");
}

Result<std::vector<int64_t>> PruneCheckpoints(const RunLayout& layout, int keep) {
  std::vector<int64_t> removed;
  if (keep <= 0) return removed;
  std::vector<std::pair<int64_t, bool>> found;  // step, complete
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(layout.checkpoints(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !e.is_directory(ec)) continue;
    const int64_t step = std::atoll(name.c_str() + 5);
    if (layout.checkpoint(step) != e.path().string()) continue;  // not one of ours (step_x)
    found.emplace_back(step, fs::exists(e.path() / "manifest.json", ec));
  }
  std::sort(found.rbegin(), found.rend());
  int complete = 0;
  bool seen_complete = false;
  Status first_error;
  for (const auto& [step, done] : found) {
    const bool drop = done ? ++complete > keep : seen_complete;
    seen_complete = seen_complete || done;
    if (!drop) continue;
    fs::remove_all(layout.checkpoint(step), ec);
    if (ec) {
      if (first_error.ok())
        first_error = Internal("cannot remove " + layout.checkpoint(step) + ": " + ec.message());
      ec.clear();
      continue;
    }
    removed.push_back(step);
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

Result<std::string> PersistMemoryShards(const RunLayout& layout,
                                        const std::vector<std::string>& node_memory_dirs,
                                        const std::string& memory_root, int rank, int world,
                                        int manifest_wait_ms) {
  std::map<int64_t, std::vector<std::string>> mine;  // step -> this rank's copies
  std::error_code ec;
  for (const std::string& dir : node_memory_dirs) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      int r = -1;
      int64_t step = -1;
      if (ParseMemoryShardName(e.path().filename().string(), &r, &step) && r == rank)
        mine[step].push_back(e.path().string());
    }
  }
  std::string log;
  Status first_error;
  std::vector<int64_t> saved;
  // The two newest steps: ranks stopped a step apart still share one.
  int64_t from = mine.size() > 2 ? std::prev(mine.end(), 2)->first : INT64_MIN;
  for (const auto& [step, copies] : mine) {
    if (step < from) continue;
    if (fs::exists(layout.checkpoint(step) + "/manifest.json", ec)) continue;  // on disk already
    for (const std::string& path : copies) {
      auto bytes = ReadShard(path);
      if (!bytes.ok()) continue;
      const std::string shard = layout.checkpoint(step) + "/rank_" + std::to_string(rank) + ".bin";
      if (Status st = WriteShard(shard, *bytes, /*sync=*/true); !st.ok()) {
        if (first_error.ok()) first_error = st;
        break;
      }
      saved.push_back(step);
      break;
    }
  }
  if (!first_error.ok()) return first_error;  // the memory copies stay: they are the only ones
  if (rank == 0) {                            // the newest step every rank saved is enough
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      Status st = WriteCheckpointManifest(layout, *it, world, manifest_wait_ms);
      if (st.ok()) break;
      log += "[checkpoint] " + st.message() + "\n";
    }
  }
  for (const auto& [step, copies] : mine) {
    for (const std::string& path : copies) {
      fs::remove(path, ec);
      fs::remove(path + ".sum", ec);
    }
  }
  for (const std::string& dir : node_memory_dirs) {
    for (fs::path d = dir; d.string().size() >= memory_root.size() &&
                           d.string().compare(0, memory_root.size(), memory_root) == 0;
         d = d.parent_path()) {
      if (!fs::remove(d, ec)) break;  // not empty (a peer's files), or gone
    }
  }
  std::string steps;
  for (int64_t s : saved) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
  log += "moved rank " + std::to_string(rank) + "'s state out of host memory: " +
         (saved.empty() ? std::string("nothing to move") : "steps " + steps + " now on disk") +
         "\n";
  return log;
}

}  // namespace megascope::launch
