#include "megascope/tracer/dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dump_internal.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/json_fields.h"

namespace megascope::tracer {
namespace {

using nlohmann::json;

nlohmann::ordered_json NsOrNull(int64_t ns) {
  return ns == 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(ns);
}

// ,"key":value (null when `null`), as nlohmann's compact dump writes it.
template <typename Int>
void AppendField(std::string& out, std::string_view key, Int v, bool null = false) {
  out += ",\"";
  out += key;
  out += "\":";
  if (null) {
    out += "null";
    return;
  }
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}
// ,"key":"value" for the enum spellings (plain ASCII, nothing to escape).
void AppendString(std::string& out, std::string_view key, std::string_view v) {
  out += ",\"";
  out += key;
  out += "\":\"";
  out += v;
  out += '"';
}

using Fields = JsonFields;  // field access with errors that say where the problem is

// A known field's value; one this build does not know reads as E::kUnknown and is kept in `d`.
template <typename E>
Result<E> Enum(const Fields& f, const char* key, std::optional<E> (*parse)(std::string_view),
               Dump* d, const std::string& where) {
  ASSIGN_OR_RETURN(std::string s, f.Str(key));
  auto e = parse(s);
  if (!e) {
    d->unknown_values.push_back({where, key, s});
    return E::kUnknown;
  }
  return *e;
}

}  // namespace

std::optional<RankRun> RangeOfRanks(int64_t start, int64_t stop, int64_t step, size_t have) {
  constexpr int64_t kLim = int64_t{1} << 40;  // keeps the arithmetic below in range
  if (start < 0 || start > kLim || stop < -kLim || stop > kLim || step < -kLim || step > kLim ||
      step == 0) {
    return std::nullopt;
  }
  const int64_t n = step > 0 ? (stop - start + step - 1) / step : (start - stop - step - 1) / -step;
  if (n <= 0 || have + static_cast<uint64_t>(n) > kMaxGroupSize) return std::nullopt;
  const int64_t last = start + (n - 1) * step;
  if (start > INT32_MAX || last < 0 || last > INT32_MAX) return std::nullopt;
  return RankRun{static_cast<int32_t>(start), static_cast<uint32_t>(n), static_cast<int32_t>(step)};
}

namespace {

// A group's members: `ranks` (a list) or, for a large group, `rank_ranges` (Python ranges
// [start, stop, step], so a world of 12,288 ranks is [[0, 12288, 1]]).
Status ReadMembers(const json& gj, const std::string& where, RankList* out) {
  if (auto it = gj.find("rank_ranges"); it != gj.end()) {
    if (!it->is_array()) return InvalidArgument(where + ": rank_ranges should be an array");
    for (const json& r : *it) {
      if (!r.is_array() || r.size() != 3 || !r[0].is_number_integer() ||
          !r[1].is_number_integer() || !r[2].is_number_integer()) {
        return InvalidArgument(where + ": each of rank_ranges should be [start, stop, step]");
      }
      const auto run =
          RangeOfRanks(r[0].get<int64_t>(), r[1].get<int64_t>(), r[2].get<int64_t>(), out->size());
      if (!run) {
        return InvalidArgument(where + ": rank_ranges entry " + r.dump() +
                               " is not a non-empty range of ranks");
      }
      out->AppendRun(run->first, run->count, run->stride);
    }
    return Status::Ok();
  }
  auto it = gj.find("ranks");
  if (it == gj.end() || !it->is_array())
    return InvalidArgument(where + ": needs 'ranks' (an array) or 'rank_ranges'");
  for (const json& r : *it) {
    if (!r.is_number_integer()) return InvalidArgument(where + ": ranks must be integers");
    out->push_back(r.get<int32_t>());
  }
  return Status::Ok();
}

// The rank's identity and coordinates, dumped_at_ns and alive (format and version are read).
Status ReadInfo(const json& j, const Fields& top, const std::string& src, Dump& d) {
  RankInfo& info = d.snapshot.info;
  ASSIGN_OR_RETURN(info.job, top.Str("job"));
  ASSIGN_OR_RETURN(int64_t attempt, top.Int("attempt"));
  ASSIGN_OR_RETURN(int64_t rank, top.Int("rank"));
  ASSIGN_OR_RETURN(int64_t world, top.Int("world_size"));
  ASSIGN_OR_RETURN(info.node, top.Str("node"));
  ASSIGN_OR_RETURN(int64_t pid, top.Int("pid"));
  if (rank < 0 || world <= 0 || rank >= world) {
    return InvalidArgument(src + ": rank " + std::to_string(rank) + " is outside world_size " +
                           std::to_string(world));
  }
  info.attempt = static_cast<int32_t>(attempt);
  info.rank = static_cast<int32_t>(rank);
  info.world_size = static_cast<int32_t>(world);
  info.pid = static_cast<int32_t>(pid);
  ASSIGN_OR_RETURN(const json* coords, top.Get("coords", json::value_t::object));
  Fields c(*coords, src + ": coords");
  ASSIGN_OR_RETURN(int64_t dp, c.Int("dp"));
  ASSIGN_OR_RETURN(int64_t pp, c.Int("pp"));
  ASSIGN_OR_RETURN(int64_t tp, c.Int("tp"));
  info.coords = {static_cast<int32_t>(dp), static_cast<int32_t>(pp), static_cast<int32_t>(tp)};
  if (auto it = j.find("clock_offset_ns"); it != j.end() && it->is_number_integer()) {
    info.clock_offset_ns = it->get<int64_t>();
  }
  if (auto it = j.find("local_rank"); it != j.end() && it->is_number_integer()) {
    info.local_rank = it->get<int32_t>();
  }
  ASSIGN_OR_RETURN(d.dumped_at_ns, top.Int("dumped_at_ns"));
  ASSIGN_OR_RETURN(const json* alive, top.Get("alive", json::value_t::boolean));
  d.alive = alive->get<bool>();
  return Status::Ok();
}

Status ReadHeartbeat(const Fields& top, const std::string& src, Dump& d) {
  ASSIGN_OR_RETURN(const json* hbj, top.Get("heartbeat", json::value_t::object));
  Fields hb(*hbj, src + ": heartbeat");
  ASSIGN_OR_RETURN(d.snapshot.heartbeat.step, hb.Int("step"));
  ASSIGN_OR_RETURN(d.snapshot.heartbeat.phase,
                   Enum<Phase>(hb, "phase", &ParsePhase, &d, "heartbeat"));
  ASSIGN_OR_RETURN(d.snapshot.heartbeat.updated_at_ns, hb.IntOrNull("updated_at_ns", 0));
  return Status::Ok();
}

Status ReadGroups(const Fields& top, const std::string& src, Dump& d) {
  ASSIGN_OR_RETURN(const json* groups, top.Get("groups", json::value_t::array));
  for (size_t i = 0; i < groups->size(); ++i) {
    const json& gj = (*groups)[i];
    std::string where = src + ": groups[" + std::to_string(i) + "]";
    if (!gj.is_object()) return InvalidArgument(where + " should be an object");
    Fields g(gj, where);
    GroupInfo gi;
    ASSIGN_OR_RETURN(gi.name, g.Str("name"));
    ASSIGN_OR_RETURN(gi.kind, g.Str("kind"));
    RETURN_IF_ERROR(ReadMembers(gj, where, &gi.ranks));
    for (const GroupInfo& other : d.snapshot.groups) {
      if (other.name == gi.name)
        return InvalidArgument(where + ": group '" + gi.name + "' appears twice");
    }
    d.snapshot.groups.push_back(std::move(gi));
  }
  return Status::Ok();
}

// Entry `i` (`ej`); unknown values are kept in `d`.
Result<FlightEntry> ReadEntry(const json& ej, size_t i, const std::string& src, Dump& d) {
  const std::string where = src + ": entries[" + std::to_string(i) + "]";
  const std::string place = "entries[" + std::to_string(i) + "]";  // where unknown values are
  if (!ej.is_object()) return InvalidArgument(where + " should be an object");
  Fields e(ej, where);
  FlightEntry f;
  f.id = i + 1;
  ASSIGN_OR_RETURN(std::string group, e.Str("group"));
  auto git = std::find_if(d.snapshot.groups.begin(), d.snapshot.groups.end(),
                          [&](const GroupInfo& g) { return g.name == group; });
  if (git == d.snapshot.groups.end()) {
    return InvalidArgument(where + ": group '" + group + "' is not listed in 'groups'");
  }
  f.group = static_cast<int32_t>(git - d.snapshot.groups.begin());
  ASSIGN_OR_RETURN(int64_t seq, e.Int("seq"));
  f.seq = static_cast<uint64_t>(seq);
  ASSIGN_OR_RETURN(f.op, Enum<OpType>(e, "op", &ParseOpType, &d, place));
  ASSIGN_OR_RETURN(int64_t peer, e.IntOrNull("peer", -1));
  f.peer = static_cast<int32_t>(peer);
  if (IsP2P(f.op) && f.peer < 0)
    return InvalidArgument(where + ": a " + std::string(Name(f.op)) + " needs a peer");
  ASSIGN_OR_RETURN(int64_t bytes, e.Int("bytes"));
  f.bytes = static_cast<uint64_t>(bytes);
  ASSIGN_OR_RETURN(f.dtype, Enum<DType>(e, "dtype", &ParseDType, &d, place));
  ASSIGN_OR_RETURN(f.state, Enum<OpState>(e, "state", &ParseOpState, &d, place));
  ASSIGN_OR_RETURN(f.enqueued_at_ns, e.IntOrNull("enqueued_at_ns", 0));
  ASSIGN_OR_RETURN(f.started_at_ns, e.IntOrNull("started_at_ns", 0));
  ASSIGN_OR_RETURN(f.completed_at_ns, e.IntOrNull("completed_at_ns", 0));
  ASSIGN_OR_RETURN(f.bytes_sent, e.IntOrNull("bytes_sent", -1));
  ASSIGN_OR_RETURN(f.bytes_received, e.IntOrNull("bytes_received", -1));
  if (e.Has("waiting_on")) {
    ASSIGN_OR_RETURN(f.waiting_on, Enum<WaitSide>(e, "waiting_on", &ParseWaitSide, &d, place));
  }
  return f;
}

Status ReadStacks(const json& stacks, const std::string& src, Dump& d) {
  if (!stacks.is_array()) return InvalidArgument(src + ": stacks should be an array");
  for (size_t i = 0; i < stacks.size(); ++i) {
    const std::string where = src + ": stacks[" + std::to_string(i) + "]";
    const json& tj = stacks[i];
    if (!tj.is_object()) return InvalidArgument(where + " should be an object");
    Fields t(tj, where);
    ThreadStack ts;
    ASSIGN_OR_RETURN(int64_t tid, t.Int("tid"));
    ts.tid = static_cast<int>(tid);
    ASSIGN_OR_RETURN(ts.name, t.Str("thread"));
    ASSIGN_OR_RETURN(const json* frames, t.Get("frames", json::value_t::array));
    for (const json& f : *frames) {
      if (!f.is_string()) return InvalidArgument(where + ": frames must be strings");
      ts.frames.push_back(f.get<std::string>());
    }
    d.stacks.push_back(std::move(ts));
  }
  return Status::Ok();
}

Result<Dump> ParseDumpJson(const json& j, const std::string& src) {
  if (!j.is_object()) return InvalidArgument(src + ": a dump must be a JSON object");
  Fields top(j, src);
  ASSIGN_OR_RETURN(std::string format, top.Str("format"));
  if (format != kDumpFormat) {
    return FailedPrecondition(src + ": format is '" + format + "', expected '" +
                              std::string(kDumpFormat) + "'");
  }
  ASSIGN_OR_RETURN(int64_t version, top.Int("version"));
  if (version != kDumpVersion) {
    return FailedPrecondition(src + ": dump version " + std::to_string(version) +
                              " is not supported (this build reads version " +
                              std::to_string(kDumpVersion) + ")");
  }
  Dump d;
  RETURN_IF_ERROR(ReadInfo(j, top, src, d));
  RETURN_IF_ERROR(ReadHeartbeat(top, src, d));
  RETURN_IF_ERROR(ReadGroups(top, src, d));
  ASSIGN_OR_RETURN(const json* entries, top.Get("entries", json::value_t::array));
  for (size_t i = 0; i < entries->size(); ++i) {
    ASSIGN_OR_RETURN(FlightEntry f, ReadEntry((*entries)[i], i, src, d));
    d.snapshot.entries.push_back(f);
  }
  if (auto it = j.find("stacks"); it != j.end()) RETURN_IF_ERROR(ReadStacks(*it, src, d));
  return d;
}

// The signal handler's only job: one byte into the pipe.
std::atomic<int> g_signal_pipe_wr{-1};
void OnDumpSignal(int) {
  int fd = g_signal_pipe_wr.load();
  if (fd >= 0) {
    char b = 's';
    [[maybe_unused]] ssize_t n = ::write(fd, &b, 1);
  }
}

}  // namespace

std::string DumpToJson(const Dump& d) {
  std::string out;
  AppendDumpJson(d, &out);
  return out;
}

namespace {

using ojson = nlohmann::ordered_json;  // keeps docs/formats.md's field order

// The header: every field before the groups, in docs/formats.md's order.
ojson HeaderJson(const Dump& d) {
  const RankSnapshot& s = d.snapshot;
  ojson j;
  j["format"] = kDumpFormat;
  j["version"] = kDumpVersion;
  j["job"] = s.info.job;
  j["attempt"] = s.info.attempt;
  j["rank"] = s.info.rank;
  j["world_size"] = s.info.world_size;
  j["node"] = s.info.node;
  j["local_rank"] = s.info.local_rank;
  j["pid"] = s.info.pid;
  j["coords"] = {{"dp", s.info.coords.dp}, {"pp", s.info.coords.pp}, {"tp", s.info.coords.tp}};
  j["clock_offset_ns"] = s.info.clock_offset_ns;
  j["dumped_at_ns"] = d.dumped_at_ns;
  j["alive"] = d.alive;
  j["heartbeat"] = {{"step", s.heartbeat.step},
                    {"phase", Name(s.heartbeat.phase)},
                    {"updated_at_ns", NsOrNull(s.heartbeat.updated_at_ns)}};
  j["records_total"] = s.records_total;
  j["dropped_records"] = s.dropped_total;
  return j;
}

// A group: its members listed, or as runs (rank_ranges) when it is large and has no run of one
// rank repeated.
ojson GroupJson(const GroupInfo& g) {
  ojson gj = {{"name", g.name}, {"kind", g.kind}};
  const auto& runs = g.ranks.runs();
  const bool compact = g.ranks.size() > kListedGroupSize &&
                       std::none_of(runs.begin(), runs.end(), [](const RankList::Run& r) {
                         return r.count > 1 && r.stride == 0;
                       });
  if (!compact) {
    gj["ranks"] = g.ranks.ToVector();
    return gj;
  }
  ojson ranges = ojson::array();
  for (const RankList::Run& r : runs) {
    const int64_t step = r.count > 1 ? r.stride : 1;
    ranges.push_back({r.first, r.first + step * r.count, step});
  }
  gj["rank_ranges"] = std::move(ranges);
  return gj;
}

// One entry on one line, written directly: building a JSON tree for each made the agent's answer
// for a node's ranks cost more than reading it. `group_names`: the groups' names as JSON strings.
void AppendEntry(std::string& out, const FlightEntry& e,
                 const std::vector<std::string>& group_names) {
  const bool known_group = e.group >= 0 && static_cast<size_t>(e.group) < group_names.size();
  out += "{\"group\":";
  out += known_group ? group_names[e.group] : "\"?" + std::to_string(e.group) + "\"";
  AppendField(out, "seq", e.seq);
  AppendString(out, "op", Name(e.op));
  AppendField(out, "peer", e.peer, e.peer < 0);
  AppendField(out, "bytes", e.bytes);
  AppendString(out, "dtype", Name(e.dtype));
  AppendString(out, "state", Name(e.state));
  AppendField(out, "enqueued_at_ns", e.enqueued_at_ns, e.enqueued_at_ns == 0);
  AppendField(out, "started_at_ns", e.started_at_ns, e.started_at_ns == 0);
  AppendField(out, "completed_at_ns", e.completed_at_ns, e.completed_at_ns == 0);
  AppendField(out, "bytes_sent", e.bytes_sent, e.bytes_sent < 0);
  AppendField(out, "bytes_received", e.bytes_received, e.bytes_received < 0);
  if (e.waiting_on != WaitSide::kNone) AppendString(out, "waiting_on", Name(e.waiting_on));
  out += '}';
}

// ,"key": [ item, item ] -- each item on a line of its own unless `one_line`; `write(i)` appends
// item i.
template <typename Write>
void AppendList(std::string& out, const char* key, size_t n, bool one_line, Write&& write) {
  const std::string_view nl = one_line ? "" : "\n", indent = one_line ? "" : " ";
  out += ",";
  out += nl;
  out += indent;
  out += "\"";
  out += key;
  out += "\": [";
  for (size_t i = 0; i < n; ++i) {
    out += i ? "," : "";
    out += nl;
    out += indent;
    out += indent;
    write(i);
  }
  if (n != 0) {
    out += nl;
    out += indent;
  }
  out += "]";
}

}  // namespace

void AppendDumpJson(const Dump& d, std::string* to, bool one_line) {
  std::string& out = *to;
  const RankSnapshot& s = d.snapshot;
  // The header one field a line, each group and entry on one line of its own: readable, greppable,
  // and a third smaller than indenting every field (a 12,288-rank job writes a gigabyte of these).
  out += HeaderJson(d).dump(one_line ? -1 : 1);
  out.pop_back();  // the closing brace
  AppendList(out, "groups", s.groups.size(), one_line,
             [&](size_t i) { out += GroupJson(s.groups[i]).dump(); });
  std::vector<std::string> group_names(s.groups.size());
  for (size_t g = 0; g < s.groups.size(); ++g) group_names[g] = ojson(s.groups[g].name).dump();
  out.reserve(out.size() + s.entries.size() * 300);
  AppendList(out, "entries", s.entries.size(), one_line,
             [&](size_t i) { AppendEntry(out, s.entries[i], group_names); });
  if (!d.stacks.empty()) {  // none: written by a reader, or not asked for
    AppendList(out, "stacks", d.stacks.size(), one_line, [&](size_t i) {
      const ThreadStack& t = d.stacks[i];
      out += ojson{{"tid", t.tid}, {"thread", t.name}, {"frames", t.frames}}.dump();
    });
  }
  out += one_line ? "" : "\n";
  out += "}\n";
}

Result<Dump> ParseDump(std::string_view text, const std::string& source) {
  if (auto fast = ParseDumpFast(text)) return std::move(*fast);
  return ParseDumpReference(text, source);
}

Result<Dump> ParseDumpReference(std::string_view text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again with exceptions only to get the position of the error.
    try {
      json again = json::parse(text);
    } catch (const json::parse_error& e) {
      return InvalidArgument(source + ": malformed JSON at byte " + std::to_string(e.byte));
    } catch (const json::exception& e) {  // e.g. a number beyond double's range
      return InvalidArgument(source + ": unreadable JSON (" + e.what() + ")");
    }
    return InvalidArgument(source + ": malformed JSON");
  }
  return ParseDumpJson(j, source);
}

Result<Dump> ReadDumpFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().WithContext("cannot open dump");
  return ParseDump(*text, path);
}

Result<std::unique_ptr<SignalDumper>> SignalDumper::Start(std::function<void()> on_signal,
                                                          int signo) {
  int fds[2];
  if (g_signal_pipe_wr.load() >= 0) return FailedPrecondition("a SignalDumper is already running");
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    return ErrnoError("pipe for the dump signal", errno);
  g_signal_pipe_wr.store(fds[1]);
  struct sigaction sa {};
  sa.sa_handler = &OnDumpSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (::sigaction(signo, &sa, nullptr) != 0) {
    int err = errno;
    g_signal_pipe_wr.store(-1);
    ::close(fds[0]);
    ::close(fds[1]);
    return ErrnoError("sigaction", err);
  }
  std::unique_ptr<SignalDumper> d(new SignalDumper());
  d->on_signal_ = std::move(on_signal);
  d->signo_ = signo;
  const int rd = fds[0];
  d->thread_ = std::thread([rd, fn = d->on_signal_] {
    for (;;) {
      pollfd p{rd, POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno == EINTR) continue;
      char buf[64];
      ssize_t n = ::read(rd, buf, sizeof(buf));
      if (n == 0) break;  // write end closed: stop
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        break;
      }
      if (std::memchr(buf, 's', static_cast<size_t>(n)) != nullptr) fn();
      if (std::memchr(buf, 'q', static_cast<size_t>(n)) != nullptr) break;
    }
    ::close(rd);
  });
  return d;
}

SignalDumper::~SignalDumper() {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  ::sigaction(signo_, &sa, nullptr);
  int wr = g_signal_pipe_wr.exchange(-1);
  if (wr >= 0) {
    char q = 'q';
    [[maybe_unused]] ssize_t n = ::write(wr, &q, 1);
    ::close(wr);
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace megascope::tracer
