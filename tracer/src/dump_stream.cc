#include <bit>
#include <cstring>

#include "megascope/tracer/dump.h"

namespace megascope::tracer {
namespace {

static_assert(std::endian::native == std::endian::little, "the dump stream is little-endian");

// The enum spellings a stream's header sends, in code order: the writer's codes mean these names.
constexpr OpType kOps[] = {OpType::kAllreduce, OpType::kReduceScatter, OpType::kAllgather,
                           OpType::kBroadcast, OpType::kReduce,        OpType::kBarrier,
                           OpType::kAlltoall,  OpType::kSend,          OpType::kRecv};
constexpr OpState kStates[] = {OpState::kEnqueued, OpState::kStarted, OpState::kCompleted,
                               OpState::kFailed};
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBf16, DType::kF64,
                             DType::kI32, DType::kI64, DType::kU8,   DType::kU16};
constexpr Phase kPhases[] = {Phase::kInit,     Phase::kData,      Phase::kForward,
                             Phase::kBackward, Phase::kOptimizer, Phase::kCheckpoint,
                             Phase::kIdle,     Phase::kDone};
constexpr WaitSide kWaits[] = {WaitSide::kNone, WaitSide::kGpu, WaitSide::kNetwork};
constexpr size_t kEntryBytes = 4 + 8 + 1 + 4 + 8 + 1 + 1 + 5 * 8 + 1;
constexpr size_t kMaxString = 1 << 16;

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}
void PutString(std::string* out, std::string_view s) {
  Put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
template <typename E, size_t N>
void PutTable(std::string* out, const E (&values)[N]) {
  Put<uint8_t>(out, N);
  for (E v : values) PutString(out, Name(v));
}

// What the JSON form can carry: a name that is not UTF-8 could not be written back as JSON.
bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) {
      n = 1, cp = c & 0x1fu;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2, cp = c & 0x0fu;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3, cp = c & 0x07u;
    } else {
      return false;
    }
    if (s.size() - i - 1 < n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3fu);
    }
    if ((n == 2 && cp < 0x800) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// Bounds-checked reading of one frame; every error says what was being read.
class In {
 public:
  explicit In(std::string_view data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n = 0;
    if (!Get(&n) || n > kMaxString || data_.size() - at_ < n) return false;
    s->assign(data_.data() + at_, n);
    at_ += n;
    return true;
  }
  size_t Left() const { return data_.size() - at_; }
  size_t At() const { return at_; }

 private:
  std::string_view data_;
  size_t at_ = 0;
};

// The header's enum table: each code's spelling mapped to this build's code (255: not known).
// False while the buffer does not hold all of it.
template <typename E>
bool ReadTable(In& in, std::optional<E> (*parse)(std::string_view),
               std::vector<DumpStreamReader::Code>* table) {
  uint8_t n = 0;
  if (!in.Get(&n)) return false;
  for (uint8_t i = 0; i < n; ++i) {
    std::string name;
    if (!in.GetString(&name)) return false;
    const auto e = parse(name);
    table->push_back({e ? static_cast<uint8_t>(*e) : static_cast<uint8_t>(255), std::move(name)});
  }
  return true;
}

// A frame that ends inside `what`.
Status CutShort(const std::string& where, const In& in, size_t frame_size, const char* what) {
  return DataLoss(where + ": cut short in " + what + " (byte " + std::to_string(in.At()) + " of " +
                  std::to_string(frame_size) + ")");
}

// A frame's `groups` groups, each its name, kind and runs of ranks (the JSON form's rules).
Status ReadFrameGroups(In& in, const std::string& where, size_t frame_size, uint32_t groups,
                       Dump& d) {
  d.snapshot.groups.resize(groups);
  for (uint32_t i = 0; i < groups; ++i) {
    GroupInfo& g = d.snapshot.groups[i];
    uint32_t runs = 0;
    if (!in.GetString(&g.name) || !in.GetString(&g.kind) || !in.Get(&runs) || runs > in.Left() / 12)
      return CutShort(where, in, frame_size, "the groups");
    if (!ValidUtf8(g.name) || !ValidUtf8(g.kind))
      return InvalidArgument(where + ": groups[" + std::to_string(i) + "]: a name is not UTF-8");
    for (uint32_t k = 0; k < runs; ++k) {
      RankList::Run r;
      if (!in.Get(&r.first) || !in.Get(&r.stride) || !in.Get(&r.count))
        return CutShort(where, in, frame_size, "the groups");
      // The JSON form's rule: each run a non-empty range of ranks in [0, INT32_MAX], the group
      // no larger than kMaxGroupSize.
      const int64_t last = r.first + static_cast<int64_t>(r.stride) * (int64_t{r.count} - 1);
      if (r.count == 0 || r.first < 0 || last < 0 || last > INT32_MAX ||
          g.ranks.size() + r.count > kMaxGroupSize) {
        return InvalidArgument(where + ": group '" + g.name + "' has a run of " +
                               std::to_string(r.count) + " ranks from " + std::to_string(r.first) +
                               " by " + std::to_string(r.stride) + " that is not a range of ranks");
      }
      g.ranks.AppendRun(r.first, r.count, r.stride);
    }
    for (uint32_t k = 0; k < i; ++k) {
      if (d.snapshot.groups[k].name == g.name)
        return InvalidArgument(where + ": group '" + g.name + "' appears twice");
    }
  }
  return Status::Ok();
}

}  // namespace

void AppendDumpStreamHeader(std::string* out) {
  out->append(kDumpStreamMagic);
  Put<uint32_t>(out, kDumpStreamVersion);
  PutTable(out, kOps);
  PutTable(out, kStates);
  PutTable(out, kDTypes);
  PutTable(out, kPhases);
  PutTable(out, kWaits);
}

void AppendDumpFrame(const Dump& d, std::string* out) {
  const size_t start = out->size();
  Put<uint32_t>(out, 0);  // the frame's length, filled in below
  const RankInfo& info = d.snapshot.info;
  Put<uint8_t>(out, d.alive ? 1 : 0);
  Put<int64_t>(out, d.dumped_at_ns);
  PutString(out, info.job);
  PutString(out, info.node);
  for (int32_t v : {info.rank, info.world_size, info.local_rank, info.attempt, info.pid,
                    info.coords.dp, info.coords.pp, info.coords.tp})
    Put<int32_t>(out, v);
  Put<int64_t>(out, info.clock_offset_ns);
  const HeartbeatState& hb = d.snapshot.heartbeat;
  Put<int64_t>(out, hb.step);
  Put<uint8_t>(out, static_cast<uint8_t>(hb.phase));
  Put<int64_t>(out, hb.updated_at_ns);
  Put<uint32_t>(out, static_cast<uint32_t>(d.snapshot.groups.size()));
  for (const GroupInfo& g : d.snapshot.groups) {
    PutString(out, g.name);
    PutString(out, g.kind);
    Put<uint32_t>(out, static_cast<uint32_t>(g.ranks.runs().size()));
    for (const RankList::Run& r : g.ranks.runs()) {
      Put<int32_t>(out, r.first);
      Put<int32_t>(out, r.stride);
      Put<uint32_t>(out, r.count);
    }
  }
  Put<uint32_t>(out, static_cast<uint32_t>(d.snapshot.entries.size()));
  const size_t entries_at = out->size();
  out->resize(entries_at + d.snapshot.entries.size() * kEntryBytes);
  char* p = out->data() + entries_at;
  auto put = [&p](auto v) {
    std::memcpy(p, &v, sizeof(v));
    p += sizeof(v);
  };
  for (const FlightEntry& e : d.snapshot.entries) {
    put(e.group);
    put(e.seq);
    put(static_cast<uint8_t>(e.op));
    put(e.peer);
    put(e.bytes);
    put(static_cast<uint8_t>(e.dtype));
    put(static_cast<uint8_t>(e.state));
    put(e.enqueued_at_ns);
    put(e.started_at_ns);
    put(e.completed_at_ns);
    put(e.bytes_sent);
    put(e.bytes_received);
    put(static_cast<uint8_t>(e.waiting_on));
  }
  const auto length = static_cast<uint32_t>(out->size() - start - sizeof(uint32_t));
  std::memcpy(out->data() + start, &length, sizeof(length));
}

DumpStreamReader::DumpStreamReader(std::string source) : source_(std::move(source)) {}

// The header's length once all of it is in the buffer, 0 while it is not.
Result<size_t> DumpStreamReader::ParseHeader() {
  In in(buffer_);
  std::string magic(kDumpStreamMagic.size(), '\0');
  for (char& c : magic) {
    if (!in.Get(&c)) return 0;
  }
  if (magic != kDumpStreamMagic)
    return InvalidArgument(source_ + ": not a megascope dump stream (no '" +
                           std::string(kDumpStreamMagic.substr(0, 7)) + "' at its start)");
  uint32_t version = 0;
  if (!in.Get(&version)) return 0;
  if (version != kDumpStreamVersion) {
    return InvalidArgument(source_ + ": dump stream version " + std::to_string(version) +
                           " is not supported (this build reads version " +
                           std::to_string(kDumpStreamVersion) + ")");
  }
  ops_.clear();
  states_.clear();
  dtypes_.clear();
  phases_.clear();
  waits_.clear();
  if (!ReadTable<OpType>(in, &ParseOpType, &ops_) ||
      !ReadTable<OpState>(in, &ParseOpState, &states_) ||
      !ReadTable<DType>(in, &ParseDType, &dtypes_) ||
      !ReadTable<Phase>(in, &ParsePhase, &phases_) ||
      !ReadTable<WaitSide>(in, &ParseWaitSide, &waits_))
    return 0;
  return in.At();
}

Status DumpStreamReader::Feed(std::string_view data, const std::function<Status(Dump)>& on_dump) {
  buffer_.append(data);
  if (!header_done_) {
    ASSIGN_OR_RETURN(const size_t header, ParseHeader());
    if (header == 0) return Status::Ok();  // not all of it yet
    header_done_ = true;
    buffer_.erase(0, header);
  }
  size_t at = 0;
  while (buffer_.size() - at >= sizeof(uint32_t)) {
    uint32_t length = 0;
    std::memcpy(&length, buffer_.data() + at, sizeof(length));
    if (length > kMaxFrame) {
      return DataLoss(source_ + ": dump " + std::to_string(frames_ + 1) + " claims " +
                      std::to_string(length) + " bytes (corrupt stream)");
    }
    if (buffer_.size() - at - sizeof(uint32_t) < length) break;
    ASSIGN_OR_RETURN(Dump d,
                     ParseFrame(std::string_view(buffer_).substr(at + sizeof(uint32_t), length)));
    at += sizeof(uint32_t) + length;
    ++frames_;
    RETURN_IF_ERROR(on_dump(std::move(d)));
  }
  buffer_.erase(0, at);
  return Status::Ok();
}

Status DumpStreamReader::Finish() const {
  if (!header_done_)
    return DataLoss(source_ + ": the stream ended before its header (" +
                    std::to_string(buffer_.size()) + " bytes)");
  if (!buffer_.empty()) {
    return DataLoss(source_ + ": the stream ended inside dump " + std::to_string(frames_ + 1) +
                    " (" + std::to_string(buffer_.size()) + " bytes of it)");
  }
  return Status::Ok();
}

Result<Dump> DumpStreamReader::ParseFrame(std::string_view frame) {
  const std::string where = source_ + ": dump " + std::to_string(frames_ + 1);
  In in(frame);
  auto cut = [&](const char* what) { return CutShort(where, in, frame.size(), what); };
  Dump d;
  RankInfo& info = d.snapshot.info;
  uint8_t alive = 0;
  if (!in.Get(&alive) || !in.Get(&d.dumped_at_ns)) return cut("its header");
  d.alive = alive != 0;
  if (!in.GetString(&info.job) || !in.GetString(&info.node)) return cut("job and node");
  if (!ValidUtf8(info.job) || !ValidUtf8(info.node))
    return InvalidArgument(where + ": its job or node name is not UTF-8");
  for (int32_t* v : {&info.rank, &info.world_size, &info.local_rank, &info.attempt, &info.pid,
                     &info.coords.dp, &info.coords.pp, &info.coords.tp}) {
    if (!in.Get(v)) return cut("the rank's identity");
  }
  if (!in.Get(&info.clock_offset_ns)) return cut("the rank's identity");
  if (info.rank < 0 || info.world_size <= 0 || info.rank >= info.world_size) {
    return InvalidArgument(where + ": rank " + std::to_string(info.rank) +
                           " is outside world_size " + std::to_string(info.world_size));
  }
  HeartbeatState& hb = d.snapshot.heartbeat;
  uint8_t phase = 0;
  if (!in.Get(&hb.step) || !in.Get(&phase) || !in.Get(&hb.updated_at_ns))
    return cut("the heartbeat");
  hb.phase = Decode<Phase>(phases_, phase, "phase", -1, &d);
  uint32_t groups = 0;
  if (!in.Get(&groups)) return cut("the groups");
  if (groups > in.Left() / 12) return cut("the groups");
  RETURN_IF_ERROR(ReadFrameGroups(in, where, frame.size(), groups, d));
  uint32_t entries = 0;
  if (!in.Get(&entries)) return cut("the entries");
  if (in.Left() != size_t{entries} * kEntryBytes) {
    return DataLoss(where + ": " + std::to_string(entries) + " entries need " +
                    std::to_string(size_t{entries} * kEntryBytes) + " bytes, the frame has " +
                    std::to_string(in.Left()));
  }
  d.snapshot.entries.resize(entries);
  for (uint32_t i = 0; i < entries; ++i) {
    FlightEntry& e = d.snapshot.entries[i];
    uint8_t op = 0, dtype = 0, state = 0, waiting = 0;
    e.id = i + 1;  // as the JSON form reads it: the issue order of what the dump holds
    in.Get(&e.group);
    in.Get(&e.seq);
    in.Get(&op);
    in.Get(&e.peer);
    in.Get(&e.bytes);
    in.Get(&dtype);
    in.Get(&state);
    for (int64_t* v : {&e.enqueued_at_ns, &e.started_at_ns, &e.completed_at_ns, &e.bytes_sent,
                       &e.bytes_received})
      in.Get(v);
    in.Get(&waiting);
    if (e.group < 0 || static_cast<uint32_t>(e.group) >= groups) {
      return InvalidArgument(where + ": entries[" + std::to_string(i) + "] is of group " +
                             std::to_string(e.group) + ", but " + std::to_string(groups) +
                             " are listed");
    }
    e.op = Decode<OpType>(ops_, op, "op", i, &d);
    e.dtype = Decode<DType>(dtypes_, dtype, "dtype", i, &d);
    e.state = Decode<OpState>(states_, state, "state", i, &d);
    e.waiting_on = Decode<WaitSide>(waits_, waiting, "waiting_on", i, &d);
    if (IsP2P(e.op) && e.peer < 0) {
      return InvalidArgument(where + ": entries[" + std::to_string(i) + "]: a " +
                             std::string(Name(e.op)) + " needs a peer");
    }
  }
  return d;
}

template <typename E>
E DumpStreamReader::Decode(const std::vector<Code>& table, uint8_t code, const char* field,
                           int64_t entry, Dump* d) {
  if (code < table.size() && table[code].mine != 255) return static_cast<E>(table[code].mine);
  // A value this build does not know (a newer writer's), or a code outside its own table.
  d->unknown_values.push_back(
      {entry < 0 ? "heartbeat" : "entries[" + std::to_string(entry) + "]", field,
       code < table.size() ? table[code].name : "code " + std::to_string(code)});
  return E::kUnknown;
}

}  // namespace megascope::tracer
