// The fast reading of a well-formed dump (simdjson, about 20x nlohmann's speed): a 12,288-rank
// job's dump directory is a gigabyte of JSON. It reads exactly what ParseDumpJson reads and gives
// up (nullopt) at the first thing it would not read the same way: anything missing, of another
// type, out of range, duplicated or unknown in a way that needs an error message. The caller then
// reads the text with ParseDumpJson, which is the reference and says what is wrong.
// tests/fuzz/fuzz_dump.cc checks that both readings agree on every input the fast one accepts.
#include <simdjson.h>

#include <algorithm>
#include <optional>

#include "dump_internal.h"

namespace megascope::tracer {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

// Each field of an object, looked up once; a key met twice gives up (nlohmann keeps the last one).
template <size_t N>
struct Slots {
  explicit Slots(const std::string_view (&k)[N]) : keys(k) {}
  const std::string_view (&keys)[N];
  element found[N];
  bool seen[N] = {};
  // Keys are looked for from the one after the last found: written in order, each is found first.
  bool Fill(object o) {
    size_t next = 0;
    for (auto [key, value] : o) {
      for (size_t k = 0; k < N; ++k) {
        const size_t i = (next + k) % N;
        if (key == keys[i]) {
          if (seen[i]) return false;
          seen[i] = true;
          found[i] = value;
          next = i + 1;
          break;
        }
      }
    }
    return true;
  }
  bool Has(size_t i) const { return seen[i]; }
  std::optional<int64_t> Int(size_t i) const {
    if (!seen[i] || found[i].type() != element_type::INT64) return std::nullopt;
    return int64_t(found[i]);
  }
  std::optional<int64_t> IntOrNull(size_t i, int64_t null_value) const {
    if (seen[i] && found[i].is_null()) return null_value;
    return Int(i);
  }
  std::optional<std::string_view> Str(size_t i) const {
    if (!seen[i] || found[i].type() != element_type::STRING) return std::nullopt;
    return std::string_view(found[i]);
  }
};

// `where` gives the place an unknown value is reported at (made only then).
template <typename E, typename Where>
std::optional<E> Enum(std::optional<std::string_view> s,
                      std::optional<E> (*parse)(std::string_view), const char* field,
                      const Where& where, Dump* d) {
  if (!s) return std::nullopt;
  if (auto e = parse(*s)) return *e;
  d->unknown_values.push_back({where(), field, std::string(*s)});
  return E::kUnknown;
}

constexpr std::string_view kTop[] = {
    "format", "version",   "job",    "attempt",         "rank",       "world_size",
    "node",   "pid",       "coords", "clock_offset_ns", "local_rank", "dumped_at_ns",
    "alive",  "heartbeat", "groups", "entries",         "stacks"};
constexpr std::string_view kStack[] = {"tid", "thread", "frames"};
constexpr std::string_view kCoords[] = {"dp", "pp", "tp"};
constexpr std::string_view kHeartbeat[] = {"step", "phase", "updated_at_ns"};
constexpr std::string_view kGroup[] = {"name", "kind", "ranks", "rank_ranges"};
constexpr std::string_view kEntry[] = {"group",
                                       "seq",
                                       "op",
                                       "peer",
                                       "bytes",
                                       "dtype",
                                       "state",
                                       "enqueued_at_ns",
                                       "started_at_ns",
                                       "completed_at_ns",
                                       "bytes_sent",
                                       "bytes_received",
                                       "waiting_on"};

// `var` names the variable it declares: it cannot be parenthesised. Gives up with `{}`: nullopt,
// or false from a reader of one part.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TRY(var, expr)       \
  auto var##_opt = (expr);   \
  if (!var##_opt) return {}; \
  auto var = *var##_opt
// NOLINTEND(bugprone-macro-parentheses)

// format, version, the rank's identity and coordinates, dumped_at_ns and alive.
bool ReadInfo(const Slots<17>& top, Dump& d) {
  TRY(format, top.Str(0));
  TRY(version, top.Int(1));
  if (format != kDumpFormat || version != kDumpVersion) return false;
  RankInfo& info = d.snapshot.info;
  TRY(job, top.Str(2));
  TRY(attempt, top.Int(3));
  TRY(rank, top.Int(4));
  TRY(world, top.Int(5));
  TRY(node, top.Str(6));
  TRY(pid, top.Int(7));
  if (rank < 0 || world <= 0 || rank >= world) return false;
  info.job = job;
  info.node = node;
  info.attempt = static_cast<int32_t>(attempt);
  info.rank = static_cast<int32_t>(rank);
  info.world_size = static_cast<int32_t>(world);
  info.pid = static_cast<int32_t>(pid);
  if (!top.Has(8) || top.found[8].type() != element_type::OBJECT) return false;
  Slots<3> c{kCoords};
  if (!c.Fill(object(top.found[8]))) return false;
  TRY(dp, c.Int(0));
  TRY(pp, c.Int(1));
  TRY(tp, c.Int(2));
  info.coords = {static_cast<int32_t>(dp), static_cast<int32_t>(pp), static_cast<int32_t>(tp)};
  for (size_t optional_int : {size_t{9}, size_t{10}}) {  // read when an integer, else ignored
    if (!top.Has(optional_int)) continue;
    const element_type t = top.found[optional_int].type();
    if (t == element_type::UINT64) return false;
    if (t != element_type::INT64) continue;
    const int64_t v = int64_t(top.found[optional_int]);
    if (optional_int == 9) {
      info.clock_offset_ns = v;
    } else {
      info.local_rank = static_cast<int32_t>(v);
    }
  }
  TRY(dumped_at, top.Int(11));
  d.dumped_at_ns = dumped_at;
  if (!top.Has(12) || top.found[12].type() != element_type::BOOL) return false;
  d.alive = bool(top.found[12]);
  return true;
}

bool ReadHeartbeat(element hj, Dump& d) {
  if (hj.type() != element_type::OBJECT) return false;
  Slots<3> hb{kHeartbeat};
  if (!hb.Fill(object(hj))) return false;
  TRY(step, hb.Int(0));
  d.snapshot.heartbeat.step = step;
  TRY(phase, Enum<Phase>(
                 hb.Str(1), &ParsePhase, "phase", [] { return std::string("heartbeat"); }, &d));
  d.snapshot.heartbeat.phase = phase;
  TRY(updated, hb.IntOrNull(2, 0));
  d.snapshot.heartbeat.updated_at_ns = updated;
  return true;
}

// A group's members: rank_ranges (runs of first, count, stride) where written, else ranks.
bool ReadMembers(const Slots<4>& g, GroupInfo& gi) {
  if (!g.Has(3)) {
    if (!g.Has(2) || g.found[2].type() != element_type::ARRAY) return false;
    for (element r : array(g.found[2])) {
      if (r.type() != element_type::INT64) return false;
      gi.ranks.push_back(static_cast<int32_t>(int64_t(r)));
    }
    return true;
  }
  if (g.found[3].type() != element_type::ARRAY) return false;
  for (element r : array(g.found[3])) {
    if (r.type() != element_type::ARRAY) return false;
    const array a(r);
    if (a.size() != 3) return false;
    int64_t v[3];
    size_t k = 0;
    for (element x : a) {
      if (x.type() != element_type::INT64) return false;
      v[k++] = int64_t(x);
    }
    auto run = RangeOfRanks(v[0], v[1], v[2], gi.ranks.size());
    if (!run) return false;
    gi.ranks.AppendRun(run->first, run->count, run->stride);
  }
  return true;
}

bool ReadGroups(element groups, Dump& d) {
  if (groups.type() != element_type::ARRAY) return false;
  for (element gj : array(groups)) {
    if (gj.type() != element_type::OBJECT) return false;
    Slots<4> g{kGroup};
    if (!g.Fill(object(gj))) return false;
    TRY(name, g.Str(0));
    TRY(kind, g.Str(1));
    GroupInfo gi{std::string(name), std::string(kind), {}};
    if (!ReadMembers(g, gi)) return false;
    for (const GroupInfo& other : d.snapshot.groups) {
      if (other.name == gi.name) return false;
    }
    d.snapshot.groups.push_back(std::move(gi));
  }
  return true;
}

// Entry `i`.
std::optional<FlightEntry> ReadEntry(element ej, size_t i, Dump& d) {
  if (ej.type() != element_type::OBJECT) return std::nullopt;
  Slots<13> e{kEntry};
  if (!e.Fill(object(ej))) return std::nullopt;
  FlightEntry f;
  f.id = i + 1;
  TRY(group, e.Str(0));
  auto git = std::find_if(d.snapshot.groups.begin(), d.snapshot.groups.end(),
                          [&](const GroupInfo& g) { return g.name == group; });
  if (git == d.snapshot.groups.end()) return std::nullopt;
  f.group = static_cast<int32_t>(git - d.snapshot.groups.begin());
  TRY(seq, e.Int(1));
  f.seq = static_cast<uint64_t>(seq);
  auto where = [i] { return "entries[" + std::to_string(i) + "]"; };
  TRY(op, Enum<OpType>(e.Str(2), &ParseOpType, "op", where, &d));
  f.op = op;
  TRY(peer, e.IntOrNull(3, -1));
  f.peer = static_cast<int32_t>(peer);
  if (IsP2P(f.op) && f.peer < 0) return std::nullopt;
  TRY(bytes, e.Int(4));
  f.bytes = static_cast<uint64_t>(bytes);
  TRY(dtype, Enum<DType>(e.Str(5), &ParseDType, "dtype", where, &d));
  f.dtype = dtype;
  TRY(state, Enum<OpState>(e.Str(6), &ParseOpState, "state", where, &d));
  f.state = state;
  TRY(enq, e.IntOrNull(7, 0));
  TRY(start, e.IntOrNull(8, 0));
  TRY(done, e.IntOrNull(9, 0));
  TRY(sent, e.IntOrNull(10, -1));
  TRY(received, e.IntOrNull(11, -1));
  f.enqueued_at_ns = enq;
  f.started_at_ns = start;
  f.completed_at_ns = done;
  f.bytes_sent = sent;
  f.bytes_received = received;
  if (e.Has(12)) {
    TRY(waiting, Enum<WaitSide>(e.Str(12), &ParseWaitSide, "waiting_on", where, &d));
    f.waiting_on = waiting;
  }
  return f;
}

bool ReadStacks(element stacks, Dump& d) {
  if (stacks.type() != element_type::ARRAY) return false;
  for (element tj : array(stacks)) {
    if (tj.type() != element_type::OBJECT) return false;
    Slots<3> t{kStack};
    if (!t.Fill(object(tj))) return false;
    TRY(tid, t.Int(0));
    TRY(name, t.Str(1));
    if (!t.Has(2) || t.found[2].type() != element_type::ARRAY) return false;
    ThreadStack ts{static_cast<int>(tid), std::string(name), {}};
    for (element f : array(t.found[2])) {
      if (f.type() != element_type::STRING) return false;
      ts.frames.emplace_back(std::string_view(f));
    }
    d.stacks.push_back(std::move(ts));
  }
  return true;
}

std::optional<Dump> Read(element root) {
  if (root.type() != element_type::OBJECT) return std::nullopt;
  Slots<17> top{kTop};
  if (!top.Fill(object(root))) return std::nullopt;
  Dump d;
  if (!ReadInfo(top, d)) return std::nullopt;
  if (!top.Has(13) || !ReadHeartbeat(top.found[13], d)) return std::nullopt;
  if (!top.Has(14) || !ReadGroups(top.found[14], d)) return std::nullopt;
  if (!top.Has(15) || top.found[15].type() != element_type::ARRAY) return std::nullopt;
  const array entries(top.found[15]);
  d.snapshot.entries.reserve(entries.size());
  size_t i = 0;
  for (element ej : entries) {
    TRY(f, ReadEntry(ej, i++, d));
    d.snapshot.entries.push_back(f);
  }
  if (top.Has(16) && !ReadStacks(top.found[16], d)) return std::nullopt;
  return d;
}

}  // namespace

std::optional<Dump> ParseDumpFast(std::string_view text) {
  thread_local simdjson::dom::parser parser;
  element root;
  if (parser.parse(text.data(), text.size()).get(root) != simdjson::SUCCESS) return std::nullopt;
  return Read(root);
}

}  // namespace megascope::tracer
