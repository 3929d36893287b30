#include "megascope/tracer/ring.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <new>

#include "segment.h"

namespace megascope::tracer {

namespace {

std::atomic<uint64_t> g_next_writer_uid{1};

uint64_t AlignUp(uint64_t v) { return (v + 63) & ~uint64_t{63}; }

void CopyName(char* dst, size_t cap, std::string_view src) {
  size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

std::string FixedString(const char* s, size_t cap) { return std::string(s, strnlen(s, cap)); }

bool ValidJobName(const std::string& job) {
  if (job.empty() || job.size() > 48) return false;
  return std::all_of(job.begin(), job.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

Status ValidateOptions(const RingOptions& o) {
  if (!ValidJobName(o.job)) {
    return InvalidArgument("job name '" + o.job + "' must be 1-48 characters of [A-Za-z0-9_-]");
  }
  if (o.rank < 0 || o.world_size <= 0 || o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is outside world size " +
                           std::to_string(o.world_size));
  }
  if (o.lanes == 0 || o.lanes > 64) return InvalidArgument("lanes must be 1..64");
  if (o.lane_capacity < 2 || !std::has_single_bit(o.lane_capacity)) {
    return InvalidArgument("lane_capacity " + std::to_string(o.lane_capacity) +
                           " must be a power of two >= 2");
  }
  if (o.flight_entries < 256) {
    return InvalidArgument("flight_entries " + std::to_string(o.flight_entries) +
                           " must be >= 256 (docs/formats.md: a dump holds at least 256 entries)");
  }
  if (o.max_names == 0 || o.max_names > 65535 || o.max_groups == 0 || o.max_groups > 65535) {
    return InvalidArgument("max_names and max_groups must be 1..65535");
  }
  return Status::Ok();
}

// A group's members, from its runs in the pool (none when the slot points outside it).
RankList MembersOf(const Segment& s, const GroupSlot& slot) {
  RankList ranks;
  if (slot.offset + uint64_t{slot.count} > s.hdr.rank_runs) return ranks;
  for (uint32_t k = 0; k < slot.count; ++k) {
    const RunSlot& run = s.pool()[slot.offset + k];
    ranks.AppendRun(run.first, run.count, run.stride);
  }
  return ranks;
}

}  // namespace

std::string RingFilePrefix(const std::string& job) { return "megascope." + job + "."; }

std::string RingFileName(const std::string& job, int32_t attempt, int32_t rank) {
  return RingFilePrefix(job) + "a" + std::to_string(attempt) + ".r" + std::to_string(rank);
}

uint64_t ProcessStartTime(int pid) {
  if (pid <= 0) return 0;
  // Asked for every rank on every answer: one read(2), no streams.
  char path[32], text[1024];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  const std::string_view stat(text, static_cast<size_t>(n));
  // The command name (field 2) may hold spaces; fields after the last ')' are plain.
  size_t at = stat.rfind(')');
  if (at == std::string_view::npos) return 0;
  // Field 3, the state: a zombie (exited, not yet reaped by its parent -- a killed launch's
  // ranks) or a dead task holds nothing, though its /proc entry is still there.
  if (at + 2 < stat.size() && (stat[at + 2] == 'Z' || stat[at + 2] == 'X')) return 0;
  // Fields 3..22: starttime is field 22, i.e. the 20th after ')'.
  for (int field = 3; field <= 22; ++field) {
    at = stat.find_first_not_of(' ', stat.find(' ', at));
    if (at == std::string_view::npos) return 0;
  }
  uint64_t start = 0;
  const auto [end, ec] = std::from_chars(stat.data() + at, stat.data() + stat.size(), start);
  return ec == std::errc() ? start : 0;
}

ClockCalibration LoadCalibration(const Segment& s) {
  CalibrationWords w{};
  if (!s.hdr.calibration.Load(&w)) return {};
  return {w.base_ticks, w.base_ns, w.ns_per_tick};
}

RankSnapshot TakeSnapshot(const Segment& s) {
  const SegmentHeader& h = s.hdr;
  RankSnapshot snap;
  RankInfo& info = snap.info;
  info.job = FixedString(h.job, sizeof(h.job));
  info.node = FixedString(h.node, sizeof(h.node));
  info.rank = h.rank;
  info.world_size = h.world_size;
  info.local_rank = h.local_rank;
  info.attempt = h.attempt;
  info.pid = h.pid;
  info.coords = {h.dp, h.pp, h.tp};
  info.clock_offset_ns = h.clock_offset_ns.load(std::memory_order_relaxed);
  ClockCalibration cal = LoadCalibration(s);

  HeartbeatWords hb{};
  if (h.heartbeat.Load(&hb)) {
    snap.heartbeat = {hb.step, static_cast<Phase>(hb.phase), 0,
                      hb.ticks == 0 ? 0 : cal.ToNs(hb.ticks)};
  }

  uint32_t ngroups = std::min(h.num_groups.load(std::memory_order_acquire), h.max_groups);
  for (uint32_t g = 0; g < ngroups; ++g) {
    const GroupSlot& slot = s.groups()[g];
    GroupInfo gi{
        FixedString(slot.name, sizeof(slot.name)), FixedString(slot.kind, sizeof(slot.kind)), {}};
    gi.ranks = MembersOf(s, slot);
    snap.groups.push_back(std::move(gi));
  }

  auto to_ns = [&](int64_t t) { return t == 0 ? int64_t{0} : cal.ToNs(t); };
  snap.entries.reserve(h.flight_entries);
  for (uint32_t i = 0; i < h.flight_entries; ++i) {
    SharedFlightEntry e{};
    if (!s.flight()[i].Load(&e) || e.id == 0) continue;
    FlightEntry f;
    f.id = e.id;
    f.group = e.group;
    f.seq = e.seq;
    f.op = e.op;
    f.peer = e.peer;
    f.bytes = e.bytes;
    f.dtype = e.dtype;
    f.state = e.state;
    f.waiting_on = e.waiting_on;
    f.enqueued_at_ns = to_ns(e.enqueued_ticks);
    f.started_at_ns = to_ns(e.started_ticks);
    f.completed_at_ns = to_ns(e.completed_ticks);
    f.bytes_sent = e.bytes_sent;
    f.bytes_received = e.bytes_received;
    snap.entries.push_back(f);
  }
  // Entry k lives in slot (k - 1) % capacity: the slots hold the entries in issue order, rotated
  // at the oldest (a sort only where a writer overtook the copy).
  auto by_id = [](const FlightEntry& a, const FlightEntry& b) { return a.id < b.id; };
  std::rotate(snap.entries.begin(),
              std::min_element(snap.entries.begin(), snap.entries.end(), by_id),
              snap.entries.end());
  if (!std::is_sorted(snap.entries.begin(), snap.entries.end(), by_id))
    std::sort(snap.entries.begin(), snap.entries.end(), by_id);
  for (auto it = snap.entries.rbegin(); it != snap.entries.rend(); ++it) {
    if (it->state == OpState::kEnqueued || it->state == OpState::kStarted) {
      snap.heartbeat.op_entry_id = it->id;  // the newest op not finished
      break;
    }
  }

  uint64_t dropped = h.unlaned_dropped.load(std::memory_order_relaxed), written = 0;
  for (uint32_t l = 0; l < h.lanes; ++l) {
    written += s.lanes()[l].head.load(std::memory_order_relaxed);
    dropped += s.lanes()[l].dropped.load(std::memory_order_relaxed);
  }
  snap.records_total = written + dropped;
  snap.dropped_total = dropped;
  return snap;
}

// ---------------------------------------------------------------- writer

namespace {

// Links the initialised segment `tmp` to `path`. A ring left there by a dead process is replaced;
// one held by a live process is AlreadyExists.
Status ClaimName(const std::string& tmp, const std::string& path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (::link(tmp.c_str(), path.c_str()) == 0) return Status::Ok();
    if (errno != EEXIST) return ErrnoError("cannot create ring " + path, errno);
    int old = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    SegmentHeader h{};
    bool live = false;
    if (old >= 0) {
      if (::pread(old, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
          h.magic.load() == kRingMagic) {
        live = h.pid != 0 && ProcessStartTime(h.pid) == h.pid_start_time;
      }
      ::close(old);
    }
    if (live) {
      return AlreadyExists("ring " + path + " is in use by live process " + std::to_string(h.pid) +
                           " (rank " + std::to_string(h.rank) + " of job '" +
                           FixedString(h.job, sizeof(h.job)) +
                           "'): is another worker running with the same job, attempt and rank?");
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return ErrnoError("cannot remove stale ring " + path, errno);
  }
  return AlreadyExists("ring " + path + " keeps reappearing; another process races us for it");
}

// Where each part of a segment of `o`'s sizes starts, and its size.
struct Layout {
  uint64_t names_off, groups_off, pool_off, flight_off, lanes_off, slots_off, total;
};

Layout LayoutOf(const RingOptions& o) {
  Layout l{};
  uint64_t off = AlignUp(sizeof(SegmentHeader));
  l.names_off = off;
  off = AlignUp(off + uint64_t{o.max_names} * sizeof(NameSlot));
  l.groups_off = off;
  off = AlignUp(off + uint64_t{o.max_groups} * sizeof(GroupSlot));
  l.pool_off = off;
  off = AlignUp(off + uint64_t{o.rank_runs} * sizeof(RunSlot));
  l.flight_off = off;
  off = AlignUp(off + uint64_t{o.flight_entries} * sizeof(SeqBlock<10>));
  l.lanes_off = off;
  off = AlignUp(off + uint64_t{o.lanes} * sizeof(LaneControl));
  l.slots_off = off;
  l.total = off + uint64_t{o.lanes} * o.lane_capacity * sizeof(Record);
  return l;
}

// A new file `tmp` of `total` bytes (the ring at `path` to be), mapped shared.
Result<void*> MapNewSegment(const std::string& tmp, const std::string& path, const std::string& dir,
                            uint64_t total) {
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ENOENT) {
      return NotFound("cannot create ring " + path + ": directory " + dir + " does not exist");
    }
    return ErrnoError("cannot create ring " + path, errno);
  }
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError("cannot allocate " + std::to_string(total >> 20) + " MiB for ring " + path,
                      err);
  }
  void* mem = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (mem == MAP_FAILED) {
    ::unlink(tmp.c_str());
    return ErrnoError("cannot map ring " + path, map_err);
  }
  return mem;
}

// Everything of the header but its magic, which is stored last.
void WriteHeader(SegmentHeader& h, const RingOptions& o, const Layout& l, const Clock& clock) {
  h.version = kRingVersion;
  h.record_version = kRecordVersion;
  h.total_size = l.total;
  h.lanes = o.lanes;
  h.lane_capacity = o.lane_capacity;
  h.flight_entries = o.flight_entries;
  h.max_names = o.max_names;
  h.max_groups = o.max_groups;
  h.rank_runs = o.rank_runs;
  h.names_off = l.names_off;
  h.groups_off = l.groups_off;
  h.pool_off = l.pool_off;
  h.flight_off = l.flight_off;
  h.lanes_off = l.lanes_off;
  h.slots_off = l.slots_off;
  CopyName(h.job, sizeof(h.job), o.job);
  CopyName(h.node, sizeof(h.node), o.node);
  CopyName(h.clock_name, sizeof(h.clock_name), clock.Name());
  h.rank = o.rank;
  h.world_size = o.world_size;
  h.local_rank = o.local_rank;
  h.attempt = o.attempt;
  h.pid = ::getpid();
  h.pid_start_time = ProcessStartTime(h.pid);
  h.dp = o.coords.dp;
  h.pp = o.coords.pp;
  h.tp = o.coords.tp;
  h.created_ns = WallNowNs();
}

}  // namespace

Result<std::unique_ptr<RingWriter>> RingWriter::Create(const RingOptions& o, const Clock& clock) {
  RETURN_IF_ERROR(ValidateOptions(o));
  const Layout layout = LayoutOf(o);
  const uint64_t total = layout.total;
  const std::string path = o.dir + "/" + RingFileName(o.job, o.attempt, o.rank);
  // The segment is built under a temporary name and linked into place only once initialised,
  // so a reader never sees a half-made ring; link() also claims the name atomically.
  const std::string tmp = path + ".init." + std::to_string(::getpid());
  ASSIGN_OR_RETURN(void* mem, MapNewSegment(tmp, path, o.dir, total));
  auto* seg = new (mem) Segment{};
  SegmentHeader& h = seg->hdr;
  WriteHeader(h, o, layout, clock);

  std::unique_ptr<RingWriter> w(new RingWriter());
  w->options_ = o;
  w->path_ = path;
  w->seg_ = seg;
  w->size_ = total;
  w->uid_ = g_next_writer_uid.fetch_add(1);
  w->cursors_ = std::make_unique<detail::LaneCursor[]>(o.lanes);
  for (uint32_t l = 0; l < o.lanes; ++l) {
    LaneControl& ctl = seg->lanes()[l];
    w->cursors_[l] = {&ctl.head, &ctl.tail, &ctl.dropped, seg->slots(l), o.lane_capacity - 1};
  }
  w->PublishCalibration(clock.Calibration());
  h.magic.store(kRingMagic, std::memory_order_release);
  w->seg_ = nullptr;  // not ours until the name is
  Status claimed = ClaimName(tmp, path);
  ::unlink(tmp.c_str());
  if (!claimed.ok()) {
    ::munmap(mem, total);
    return claimed;
  }
  w->seg_ = seg;
  return w;
}

RingWriter::~RingWriter() {
  if (detail::t_lane.writer_uid == uid_) detail::t_lane = {};
  if (seg_ != nullptr) ::munmap(seg_, size_);
  if (unlink_on_close_) ::unlink(path_.c_str());
}

detail::LaneCursor* RingWriter::AcquireLane() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto me = std::this_thread::get_id();
  detail::LaneCursor* cur = nullptr;
  auto it = std::find_if(lane_owners_.begin(), lane_owners_.end(),
                         [&](const auto& p) { return p.first == me; });
  if (it != lane_owners_.end()) {
    cur = &cursors_[it->second];
  } else if (lane_owners_.size() < options_.lanes) {
    lane_owners_.emplace_back(me, static_cast<uint32_t>(lane_owners_.size()));
    cur = &cursors_[lane_owners_.back().second];
  }
  detail::t_lane = {uid_, cur};
  return cur;
}

Record* RingWriter::DropUnlaned() {
  seg_->hdr.unlaned_dropped.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

bool RingWriter::RefreshTail(detail::LaneCursor* c) {
  c->cached_tail = c->tail->load(std::memory_order_acquire);
  if (c->pos - c->cached_tail <= c->mask) return true;
  c->dropped->store(++c->drops, std::memory_order_relaxed);
  return false;
}

Result<NameId> RingWriter::InternName(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return static_cast<NameId>(i);
  }
  if (names_.size() >= options_.max_names) {
    return FailedPrecondition("name table of ring " + path_ + " is full (" +
                              std::to_string(options_.max_names) + " names)");
  }
  auto id = static_cast<uint32_t>(names_.size());
  CopyName(seg_->names()[id].name, sizeof(NameSlot::name), name);
  names_.emplace_back(name);
  seg_->hdr.num_names.store(id + 1, std::memory_order_release);
  return static_cast<NameId>(id);
}

Result<GroupId> RingWriter::RegisterGroup(std::string_view name, std::string_view kind,
                                          const RankList& ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  SegmentHeader& h = seg_->hdr;
  uint32_t n = h.num_groups.load(std::memory_order_relaxed);
  if (name.empty() || name.size() >= sizeof(GroupSlot::name) || kind.empty() ||
      kind.size() >= sizeof(GroupSlot::kind)) {
    return InvalidArgument("group name '" + std::string(name) + "' / kind '" + std::string(kind) +
                           "' must be 1-47 / 1-7 characters");
  }
  for (uint32_t g = 0; g < n; ++g) {
    const GroupSlot& s = seg_->groups()[g];
    if (FixedString(s.name, sizeof(s.name)) != name) continue;
    if (MembersOf(*seg_, s) == ranks) return static_cast<GroupId>(g);
    return InvalidArgument("group '" + std::string(name) +
                           "' is already registered with other ranks");
  }
  if (n >= h.max_groups)
    return FailedPrecondition("group table full (" + std::to_string(n) + " groups)");
  const auto& runs = ranks.runs();
  if (h.runs_used + runs.size() > h.rank_runs) {
    return FailedPrecondition("group member pool full (" + std::to_string(h.rank_runs) +
                              " runs of ranks)");
  }
  GroupSlot& s = seg_->groups()[n];
  CopyName(s.name, sizeof(s.name), name);
  CopyName(s.kind, sizeof(s.kind), kind);
  s.offset = h.runs_used;
  s.count = static_cast<uint32_t>(runs.size());
  for (const RankList::Run& run : runs)
    seg_->pool()[h.runs_used++] = {run.first, run.stride, run.count};
  h.num_groups.store(n + 1, std::memory_order_release);
  return static_cast<GroupId>(n);
}

uint64_t RingWriter::AllocateFlightId() {
  return seg_->hdr.flight_head.fetch_add(1, std::memory_order_relaxed) + 1;
}

void RingWriter::WriteFlight(const SharedFlightEntry& e) {
  seg_->flight()[(e.id - 1) % seg_->hdr.flight_entries].Store(e);
}

uint32_t RingWriter::flight_capacity() const { return seg_->hdr.flight_entries; }

void RingWriter::WriteHeartbeat(int64_t step, Phase phase, int64_t ticks) {
  seg_->hdr.heartbeat.Store(HeartbeatWords{step, static_cast<uint64_t>(phase), ticks, 0});
}

void RingWriter::PublishCalibration(const ClockCalibration& cal) {
  seg_->hdr.calibration.Store(CalibrationWords{cal.base_ticks, cal.base_ns, cal.ns_per_tick});
}

void RingWriter::SetClockOffset(int64_t offset_ns) {
  seg_->hdr.clock_offset_ns.store(offset_ns, std::memory_order_relaxed);
}

void RingWriter::MarkClosed() { seg_->hdr.closed.store(1, std::memory_order_release); }

RankSnapshot RingWriter::Snapshot() const { return TakeSnapshot(*seg_); }

// ---------------------------------------------------------------- reader

Result<std::unique_ptr<RingReader>> RingReader::Attach(const std::string& path, Mode mode) {
  const bool consume = mode == Mode::kConsume;
  int fd = ::open(path.c_str(), (consume ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return NotFound("no ring at " + path +
                      " (the rank has not started, or its ring was removed)");
    }
    return ErrnoError("cannot open ring " + path, errno);
  }
  auto fail = [&](Status s) -> Status {
    ::close(fd);
    return s;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(ErrnoError("cannot stat ring " + path, errno));
  if (st.st_uid != ::geteuid()) {
    return fail(PermissionDenied("ring " + path + " is owned by uid " + std::to_string(st.st_uid) +
                                 ", not by this user (uid " + std::to_string(::geteuid()) +
                                 "); rings are private to the user running the job"));
  }
  if (static_cast<size_t>(st.st_size) < sizeof(SegmentHeader)) {
    return fail(FailedPrecondition(path + " is not a megascope ring (only " +
                                   std::to_string(st.st_size) + " bytes)"));
  }
  SegmentHeader h{};
  if (::pread(fd, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
    return fail(ErrnoError("cannot read ring header of " + path, errno));
  }
  uint64_t magic = h.magic.load();
  if (magic == 0)
    return fail(Status(StatusCode::kUnavailable, "ring " + path + " is still being created"));
  if (magic != kRingMagic) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(magic));
    return fail(FailedPrecondition(path + " is not a megascope ring (magic " + buf + ")"));
  }
  if (h.version != kRingVersion || h.record_version != kRecordVersion) {
    return fail(FailedPrecondition(
        "ring " + path + " has layout version " + std::to_string(h.version) + "/records " +
        std::to_string(h.record_version) + "; this build reads version " +
        std::to_string(kRingVersion) + "/" + std::to_string(kRecordVersion)));
  }
  if (h.total_size != static_cast<uint64_t>(st.st_size)) {
    return fail(DataLoss("ring " + path + " is " + std::to_string(st.st_size) +
                         " bytes but its header says " + std::to_string(h.total_size)));
  }
  if (consume && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return fail(AlreadyExists(
          "ring " + path +
          " is already being drained by another process (is another agent running?)"));
    }
    return fail(ErrnoError("cannot lock ring " + path, errno));
  }
  void* mem = ::mmap(nullptr, h.total_size, consume ? PROT_READ | PROT_WRITE : PROT_READ,
                     MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return fail(ErrnoError("cannot map ring " + path, errno));

  std::unique_ptr<RingReader> r(new RingReader());
  r->path_ = path;
  r->seg_ = static_cast<const Segment*>(mem);
  r->mut_seg_ = consume ? static_cast<Segment*>(mem) : nullptr;
  r->size_ = h.total_size;
  if (consume) {
    r->lock_fd_ = fd;  // holds the consumer lock until we go
  } else {
    ::close(fd);
  }
  r->writer_start_time_ = h.pid_start_time;
  r->info_ = TakeSnapshot(*r->seg_).info;
  return r;
}

RingReader::~RingReader() {
  if (seg_ != nullptr) ::munmap(const_cast<Segment*>(seg_), size_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

size_t RingReader::Read(std::span<Record> out, ReadBatch* batch) {
  const SegmentHeader& h = seg_->hdr;
  batch->lane_tails.assign(h.lanes, 0);
  batch->count = 0;
  if (mut_seg_ == nullptr) return 0;  // snapshot-only readers do not consume
  const uint64_t cap = h.lane_capacity, mask = cap - 1;
  size_t n = 0;
  for (uint32_t l = 0; l < h.lanes; ++l) {
    const LaneControl& c = seg_->lanes()[l];
    uint64_t tail = c.tail.load(std::memory_order_relaxed);
    uint64_t head = c.head.load(std::memory_order_acquire);
    if (tail > head) tail = head;  // never read past what was written (a bad Commit cannot loop us)
    uint64_t take = std::min<uint64_t>(head - tail, out.size() - n);
    const Record* slots = seg_->slots(l);
    uint64_t first = std::min(take, cap - (tail & mask));
    std::memcpy(&out[n], &slots[tail & mask], first * sizeof(Record));
    std::memcpy(&out[n + first], &slots[0], (take - first) * sizeof(Record));
    n += take;
    batch->lane_tails[l] = tail + take;
  }
  batch->count = n;
  return n;
}

void RingReader::Commit(const ReadBatch& batch) {
  if (mut_seg_ == nullptr) return;
  for (size_t l = 0; l < batch.lane_tails.size() && l < seg_->hdr.lanes; ++l) {
    LaneControl& c = mut_seg_->lanes()[l];
    // Forward only, and never past the writer's head.
    const uint64_t to = std::min(batch.lane_tails[l], c.head.load(std::memory_order_acquire));
    if (to > c.tail.load(std::memory_order_relaxed)) c.tail.store(to, std::memory_order_release);
  }
}

ClockCalibration RingReader::Calibration() const { return LoadCalibration(*seg_); }

std::string RingReader::NameOf(NameId id) {
  if (id >= names_.size()) {
    uint32_t n = std::min(seg_->hdr.num_names.load(std::memory_order_acquire), seg_->hdr.max_names);
    for (uint32_t i = static_cast<uint32_t>(names_.size()); i < n; ++i) {
      names_.push_back(FixedString(seg_->names()[i].name, sizeof(NameSlot::name)));
    }
  }
  return id < names_.size() ? names_[id] : "?" + std::to_string(id);
}

RankSnapshot RingReader::Snapshot() const { return TakeSnapshot(*seg_); }

std::string RingReader::Incarnation() const {
  return path_.substr(path_.rfind('/') + 1) + "#" + std::to_string(info_.pid) + "." +
         std::to_string(writer_start_time_);
}

bool RingReader::WriterAlive() const {
  return writer_start_time_ != 0 && ProcessStartTime(info_.pid) == writer_start_time_;
}

bool RingReader::Closed() const { return seg_->hdr.closed.load(std::memory_order_acquire) != 0; }

uint64_t RingReader::Dropped() const {
  uint64_t d = seg_->hdr.unlaned_dropped.load(std::memory_order_relaxed);
  for (uint32_t l = 0; l < seg_->hdr.lanes; ++l)
    d += seg_->lanes()[l].dropped.load(std::memory_order_relaxed);
  return d;
}

}  // namespace megascope::tracer
