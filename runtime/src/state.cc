#include "state.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "megascope/launch/state_files.h"

namespace megascope::runtime {
namespace {

std::atomic<int> g_writes_in_flight{0};

// Held by a background write from before its thread starts until it ends.
class WriteInFlight {
 public:
  WriteInFlight() { g_writes_in_flight.fetch_add(1); }
  WriteInFlight(const WriteInFlight&) = delete;
  WriteInFlight& operator=(const WriteInFlight&) = delete;
  ~WriteInFlight() { g_writes_in_flight.fetch_sub(1); }
};

}  // namespace

void WaitForWritesInFlight() {
  for (int i = 0; i < 400 && g_writes_in_flight.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::vector<std::string> MemoryDirsOf(const TrainConfig& cfg, int rank) {
  const std::vector<std::string> nodes = cfg.NodeNames();
  const std::string me = cfg.NodeOf(rank);
  std::vector<std::string> dirs = {NodeMemoryDir(cfg.shm_dir, cfg.job, me)};
  const auto it = std::find(nodes.begin(), nodes.end(), me);
  const std::string buddy = nodes[static_cast<size_t>((it - nodes.begin() + 1) % nodes.size())];
  if (buddy != me) dirs.push_back(NodeMemoryDir(cfg.shm_dir, cfg.job, buddy));
  return dirs;
}

std::shared_ptr<std::string> EncodeState(kernels::Kernels& k, GptStage& model, const float* m,
                                         const float* v, int64_t step, int rank) {
  // Device state comes to the host first; host memory (the CPU backend) is encoded in place.
  const size_t n = model.count();
  std::vector<float> copies[3];
  auto host = [&](const float* x, int i) {
    if (!k.IsDevicePointer(x)) return x;
    copies[i].resize(n);
    k.Download(copies[i].data(), x, n * sizeof(float));
    return static_cast<const float*>(copies[i].data());
  };
  const float* hp = host(model.params(), 0);
  const float* hm = host(m, 1);
  const float* hv = host(v, 2);
  if (std::string e = k.error(); !e.empty()) {  // never a shard of what was not read
    std::fprintf(stderr, "[checkpoint] rank %d: step %lld not saved: %s\n", rank,
                 static_cast<long long>(step), e.c_str());
    return nullptr;
  }
  return std::make_shared<std::string>(launch::EncodeShard(step, rank, n, {hp, hm, hv}));
}

Result<launch::ResumePoint> LoadState(const TrainConfig& cfg, const RunLayout& layout, int rank,
                                      kernels::Kernels& k, GptStage& model, float* m, float* v) {
  const int world = cfg.layout.world();
  launch::ResumePoint resume =
      cfg.resume_set ? cfg.resume : launch::FindDiskCheckpoint(layout, world);
  if (!resume.log.empty()) std::fprintf(stderr, "%s", resume.log.c_str());
  if (resume.step < 0) return resume;
  if (static_cast<int>(resume.files.size()) != world)
    return InvalidArgument("run.json: resume lists no shard for every rank");
  ASSIGN_OR_RETURN(std::string bytes, launch::ReadShard(resume.files[rank]));
  const size_t n = model.count();
  std::vector<float> hp(n), hm(n), hv(n);
  RETURN_IF_ERROR(launch::DecodeShard(bytes, resume.files[rank], resume.step, rank, n,
                                      {hp.data(), hm.data(), hv.data()}));
  k.Upload(model.params(), hp.data(), n * sizeof(float));
  k.Upload(m, hm.data(), n * sizeof(float));
  k.Upload(v, hv.data(), n * sizeof(float));
  if (std::string e = k.Synchronize(); !e.empty())
    return Internal("loading " + resume.files[rank] + " onto the device: " + e);
  std::fprintf(stderr, "[worker] rank %d: resumed after step %lld from %s (%s)\n", rank,
               static_cast<long long>(resume.step), resume.source.c_str(),
               resume.files[rank].c_str());
  return resume;
}

void StateWriter::Checkpoint(int64_t step, std::shared_ptr<std::string> shard) {
  JoinCheckpoint();  // one write in flight at a time
  if (shard == nullptr) return;
  auto busy = std::make_shared<WriteInFlight>();
  ckpt_ = std::thread([this, shard = std::move(shard), step, busy] {
    const std::string dir = layout_.checkpoint(step);
    for (const launch::WorkerFault& f : cfg_.faults) {  // a slow filesystem
      if (f.kind == launch::WorkerFaultKind::kSlowCheckpoint && f.rank == rank_ && step >= f.step)
        std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
    }
    const std::string path = dir + "/rank_" + std::to_string(rank_) + ".bin";
    if (Status st = launch::WriteShard(path, *shard, /*sync=*/true); !st.ok()) {
      std::fprintf(stderr, "[checkpoint] rank %d: step %lld not saved: %s\n", rank_,
                   static_cast<long long>(step), st.ToString().c_str());
      return;
    }
    if (rank_ != 0) return;
    // Rank 0 writes the manifest last, once every shard is on disk.
    if (Status st =
            launch::WriteCheckpointManifest(layout_, step, cfg_.layout.world(), 60000, stop_);
        !st.ok()) {
      std::fprintf(stderr, "[checkpoint] %s\n", st.message().c_str());
      return;
    }
    // Only once this one is complete do older ones go (never the newest complete one).
    auto pruned = launch::PruneCheckpoints(layout_, cfg_.keep_checkpoints);
    if (!pruned.ok()) std::fprintf(stderr, "[checkpoint] %s\n", pruned.status().ToString().c_str());
  });
}

void StateWriter::Snapshot(int64_t step, std::shared_ptr<std::string> shard) {
  if (mem_.joinable()) mem_.join();
  if (shard == nullptr) return;
  const std::vector<std::string> dirs = MemoryDirsOf(cfg_, rank_);
  auto busy = std::make_shared<WriteInFlight>();
  mem_ = std::thread([this, shard = std::move(shard), step, dirs, busy] {
    for (const std::string& dir : dirs) {
      if (Status st = launch::WriteShard(dir + "/" + launch::MemoryShardName(rank_, step), *shard,
                                         /*sync=*/false);
          !st.ok()) {
        std::fprintf(stderr, "[snapshot] rank %d: step %lld: %s\n", rank_,
                     static_cast<long long>(step), st.ToString().c_str());
        continue;
      }
      std::error_code ec;
      for (const char* suffix : {"", ".sum"})
        std::filesystem::remove(dir + "/" + launch::MemoryShardName(rank_, step - 3) + suffix, ec);
    }
  });
}

}  // namespace megascope::runtime
