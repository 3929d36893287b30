#include "megascope/analyzer/timeline.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "timeline_viewer.h"  // kViewerHtml, generated from dashboards/timeline/viewer.html

namespace megascope::analyzer {
namespace {

void AppendNum(std::string& out, double v) {
  char buf[32];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed, 3);
  out.append(buf, p);
}
void AppendInt(std::string& out, int64_t v) {
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, p);
}
void AppendStr(std::string& out, const std::string& s) {
  if (s.find_first_of("\"\\") == std::string::npos && std::none_of(s.begin(), s.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20;
      })) {
    out += '"';
    out += s;
    out += '"';
    return;
  }
  out += nlohmann::json(s).dump();
}

}  // namespace

namespace {

// The spans view lists every completed collective as a comm span named after its op; the timeline
// draws those from `collectives` (with group, seq, peer and bytes), so it skips them in `spans`.
constexpr const char* kCollectiveOps =
    "('allreduce','reduce_scatter','allgather','broadcast','reduce','barrier','alltoall','send',"
    "'recv')";
// Threads of a rank's asynchronous sends: overlapping sends go to lanes of their own, so that no
// two slices on one thread partly overlap (the Trace Event Format nests slices on a thread).
constexpr int kLaneTidBase = 1 << 20;
constexpr int kMaxLanes = 16;

// Builds the trace-event JSON: metadata, slices and flows, timestamps in microseconds after
// `base_ns` (relative: epoch microseconds in a double lose the nanoseconds).
class TraceWriter {
 public:
  explicit TraceWriter(int64_t base_ns) : base_ns_(base_ns) { out_.reserve(1 << 20); }
  std::string& Out() { return out_; }
  void Sep() {
    if (!first_) out_ += ",\n";
    first_ = false;
  }
  void Us(int64_t ns) { AppendNum(out_, static_cast<double>(ns - base_ns_) / 1000.0); }
  // A complete slice; `args` is the JSON of its args object without braces.
  void Slice(const std::string& name, std::string_view cat, int64_t from_ns, int64_t to_ns, int pid,
             int64_t tid, const std::string& args) {
    Sep();
    out_ += "{\"ph\":\"X\",\"name\":";
    AppendStr(out_, name);
    out_ += ",\"cat\":\"";
    out_ += cat;
    out_ += "\",\"ts\":";
    Us(from_ns);
    out_ += ",\"dur\":";
    AppendNum(out_, static_cast<double>(std::max<int64_t>(0, to_ns - from_ns)) / 1000.0);
    Thread(pid, tid);
    out_ += ",\"args\":{";
    out_ += args;
    out_ += "}}";
  }
  void Meta(std::string_view what, int pid, int64_t tid, const std::string& args) {
    Sep();
    out_ += "{\"ph\":\"M\",\"name\":\"";
    out_ += what;
    out_ += "\"";
    Thread(pid, tid);
    out_ += ",\"args\":{";
    out_ += args;
    out_ += "}}";
  }
  // A flow event ("s" or "f") bound to the slice enclosing `at_ns` on its thread.
  void Flow(char ph, int64_t id, int pid, int64_t tid, int64_t at_ns) {
    Sep();
    out_ += "{\"ph\":\"";
    out_ += ph;
    out_ += "\",\"bp\":\"e\",\"name\":\"p2p\",\"cat\":\"pipeline\",\"id\":";
    AppendInt(out_, id);
    Thread(pid, tid);
    out_ += ",\"ts\":";
    Us(at_ns);
    out_ += "}";
  }

 private:
  // ,"pid":P,"tid":T
  void Thread(int pid, int64_t tid) {
    out_ += ",\"pid\":";
    AppendInt(out_, pid);
    out_ += ",\"tid\":";
    AppendInt(out_, tid);
  }
  int64_t base_ns_;
  std::string out_;
  bool first_ = true;
};

// One member of an args object: "key":value.
std::string Key(std::string_view key) { return "\"" + std::string(key) + "\":"; }
std::string Arg(std::string_view key, int64_t v) {
  std::string s = Key(key);
  AppendInt(s, v);
  return s;
}
std::string Arg(std::string_view key, const std::string& v) {
  std::string s = Key(key);
  AppendStr(s, v);
  return s;
}

// The timeline drawn a table at a time: the ranks' threads, the spans, the completed collectives,
// the ops still open, then the flow arrows between sends and their recvs.
class TimelineBuilder {
 public:
  TimelineBuilder(RunDatabase& db, const TimelineOptions& o, int64_t base_ns)
      : db_(db),
        o_(o),
        range_(" step >= " + std::to_string(o.first_step) +
               " AND step <= " + std::to_string(o.last_step)),
        base_ns_(base_ns),
        w_(base_ns) {}

  Result<std::string> Run(const Table& ranks, TimelineStats* stats) && {
    std::string& out = w_.Out();
    out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"title\":";
    AppendStr(out, o_.title);
    out += ",\"base_ns\":" + std::to_string(base_ns_) +
           ",\"highlight_ranks\":" + nlohmann::json(o_.highlight_ranks).dump() +
           "},\"traceEvents\":[\n";
    for (const auto& row : ranks.rows) Rank(row);
    RETURN_IF_ERROR(Spans());
    RETURN_IF_ERROR(Collectives());
    RETURN_IF_ERROR(OpenOps());
    Flows();
    out += "\n]}\n";
    if (stats != nullptr)
      *stats = {nspans_, flows_, static_cast<int64_t>(distinct_ranks_.size()), nopen_};
    return std::move(out);
  }

 private:
  using RankAttempt = std::pair<int, int>;
  // A transfer's slice, kept for its flow arrow.
  struct Placed {
    int pid;
    int64_t tid, from, to;
  };
  using TransferKey =
      std::tuple<int, std::string, int64_t, int, int>;  // attempt, grp, seq, from, to

  // A rank is drawn under the node it ran on in each attempt (a restart may move it to a spare),
  // with that attempt's clock offset.
  void Rank(const std::vector<std::string>& row) {
    const int rank = std::stoi(row[0]), attempt = row[6].empty() ? 0 : std::stoi(row[6]);
    distinct_ranks_.insert(rank);
    offset_[{rank, attempt}] = row[5].empty() ? 0 : std::stoll(row[5]);
    auto [it, added] = node_pid_.try_emplace(row[1], static_cast<int>(node_pid_.size()));
    rank_pid_[{rank, attempt}] = it->second;
    if (added) w_.Meta("process_name", it->second, 0, Arg("name", row[1]));
    if (!sort_of_.try_emplace({it->second, rank}, static_cast<int>(sort_of_.size())).second) return;
    const std::string label =
        "rank " + row[0] + " (dp=" + row[2] + ", pp=" + row[3] + ", tp=" + row[4] + ")";
    w_.Meta("thread_name", it->second, rank,
            Arg("name", label) + ",\"dp\":" + row[2] + ",\"pp\":" + row[3] + ",\"tp\":" + row[4]);
    w_.Meta("thread_sort_index", it->second, rank,
            Arg("sort_index", int64_t{sort_of_[{it->second, rank}]} * (kMaxLanes + 1)));
  }

  // The lane of a send on (pid, rank) starting at `from`: the first whose slices have all ended.
  int64_t LaneTid(int pid, int rank, int64_t from, int64_t to) {
    auto& ends = lane_end_[{pid, rank}];
    size_t lane = 0;
    while (lane < ends.size() && ends[lane] > from) ++lane;
    if (lane == static_cast<size_t>(kMaxLanes)) lane = kMaxLanes - 1;  // rare: shares the last
    if (lane == ends.size()) {
      ends.push_back(to);
      const int64_t tid = kLaneTidBase + int64_t{rank} * kMaxLanes + static_cast<int64_t>(lane);
      w_.Meta("thread_name", pid, tid,
              Arg("name", "rank " + std::to_string(rank) + " sends" +
                              (lane ? " (" + std::to_string(lane + 1) + ")" : "")) +
                  ",\"rank\":" + std::to_string(rank) + ",\"lane\":" + std::to_string(lane));
      w_.Meta("thread_sort_index", pid, tid,
              Arg("sort_index", int64_t{sort_of_[{pid, rank}]} * (kMaxLanes + 1) + 1 +
                                    static_cast<int64_t>(lane)));
    }
    ends[lane] = std::max(ends[lane], to);
    return kLaneTidBase + int64_t{rank} * kMaxLanes + static_cast<int64_t>(lane);
  }

  Status Spans() {
    return db_.Scan(
        "SELECT rank, step, microbatch, kind, name, start_ns, end_ns, attempt FROM spans WHERE" +
            range_ + " AND NOT (kind = 'comm' AND name IN " + kCollectiveOps + ")",
        [&](const RunDatabase::Row& row) {
          const RankAttempt key{static_cast<int>(row.Int(0)), static_cast<int>(row.Int(7))};
          auto pid = rank_pid_.find(key);
          if (pid == rank_pid_.end()) return;
          std::string args = Arg("step", row.Int(1)) + "," + Arg("attempt", key.second);
          if (!row.IsNull(2)) args += "," + Arg("microbatch", row.Int(2));
          ++nspans_;
          w_.Slice(std::string(row.Text(4)), row.Text(3), row.Int(5) - offset_[key],
                   row.Int(6) - offset_[key], pid->second, key.first, args);
        });
  }

  // Completed collectives, with what they moved; sends on their rank's send lanes. A transfer's
  // two slices are kept for its flow arrow: the k-th send from a to b in a group and attempt
  // matches the k-th recv on b from a.
  Status Collectives() {
    return db_.Scan(
        "SELECT rank, attempt, step, grp, seq, op, peer, bytes, started_ns, completed_ns FROM "
        "collectives WHERE state = 'completed' AND started_ns IS NOT NULL AND" +
            range_ + " ORDER BY started_ns",
        [&](const RunDatabase::Row& row) {
          const RankAttempt key{static_cast<int>(row.Int(0)), static_cast<int>(row.Int(1))};
          auto pid = rank_pid_.find(key);
          if (pid == rank_pid_.end()) return;
          const std::string op(row.Text(5)), grp(row.Text(3));
          const int64_t from = row.Int(8) - offset_[key], to = row.Int(9) - offset_[key];
          std::string args = Arg("step", row.Int(2)) + "," + Arg("attempt", key.second) + "," +
                             Arg("group", grp) + "," + Arg("seq", row.Int(4)) + "," +
                             Arg("bytes", row.Int(7));
          const bool p2p = op == "send" || op == "recv";
          if (p2p && !row.IsNull(6)) args += "," + Arg("peer", row.Int(6));
          int64_t tid = key.first;
          if (op == "send") tid = LaneTid(pid->second, key.first, from, to);
          ++nspans_;
          w_.Slice(op, "comm", from, to, pid->second, tid, args);
          if (p2p && !row.IsNull(6)) {
            const int peer = static_cast<int>(row.Int(6));
            const TransferKey t{key.second, grp, row.Int(4), op == "send" ? key.first : peer,
                                op == "send" ? peer : key.first};
            (op == "send" ? sends_ : recvs_)[t] = {pid->second, tid, from, to};
          }
        });
  }

  // Ops still open when their rank's agent last looked (a hang, or the ops a rank died in): a
  // slice from when the op started on the rank (or was issued) to when it was last seen open, so
  // the hung step is not a blank. With steps chosen, those issued within the drawn spans' time.
  Status OpenOps() {
    const bool all_steps =
        o_.first_step <= 0 && o_.last_step == std::numeric_limits<int64_t>::max();
    ASSIGN_OR_RETURN(Table last, db_.Query("SELECT MAX(end_ns) FROM spans WHERE" + range_));
    const int64_t last_ns =
        last.rows.empty() || last.is_null[0][0] ? base_ns_ : std::stoll(last.rows[0][0]);
    return db_.Scan(
        "SELECT rank, attempt, op, grp, seq, peer, state, enqueued_ns, started_ns, seen_ns, bytes "
        "FROM open_collectives ORDER BY enqueued_ns",
        [&](const RunDatabase::Row& row) {
          const RankAttempt key{static_cast<int>(row.Int(0)), static_cast<int>(row.Int(1))};
          auto pid = rank_pid_.find(key);
          if (pid == rank_pid_.end()) return;
          const int64_t issued = row.Int(7);
          if (!all_steps && (issued < base_ns_ || issued > last_ns + 1000000000)) return;
          const int64_t from = (row.IsNull(8) ? issued : row.Int(8)) - offset_[key];
          const int64_t to = std::max(from, row.Int(9) - offset_[key]);
          const std::string op(row.Text(2));
          std::string args = Arg("attempt", key.second) + "," +
                             Arg("group", std::string(row.Text(3))) + "," + Arg("seq", row.Int(4)) +
                             "," + Arg("bytes", row.Int(10)) + "," +
                             Arg("state", std::string(row.Text(6))) + ",\"open\":true";
          if (row.Int(5) >= 0) args += "," + Arg("peer", row.Int(5));
          const int64_t tid =
              op == "send" ? LaneTid(pid->second, key.first, from, to) : int64_t{key.first};
          ++nopen_;
          w_.Slice(op, "open", from, to, pid->second, tid, args);
        });
  }

  // Flow arrows between drawn slices only, each end inside its slice.
  void Flows() {
    for (const auto& [t, r] : recvs_) {
      auto s = sends_.find(t);
      if (s == sends_.end()) continue;
      const Placed& a = s->second;
      const int64_t id = ++flows_;
      w_.Flow('s', id, a.pid, a.tid, a.from + std::min<int64_t>(1000, (a.to - a.from) / 2));
      w_.Flow('f', id, r.pid, r.tid, r.to - std::min<int64_t>(1000, (r.to - r.from) / 2));
    }
  }

  RunDatabase& db_;
  const TimelineOptions& o_;
  const std::string range_;
  const int64_t base_ns_;
  TraceWriter w_;
  std::map<RankAttempt, int64_t> offset_;
  std::map<std::string, int> node_pid_;
  std::map<RankAttempt, int> rank_pid_;
  std::map<std::pair<int, int>, int> sort_of_;  // (pid, rank) -> its thread's sort index
  std::set<int> distinct_ranks_;
  std::map<std::pair<int, int>, std::vector<int64_t>> lane_end_;
  std::map<TransferKey, Placed> sends_, recvs_;
  int64_t nspans_ = 0, nopen_ = 0, flows_ = 0;
};

}  // namespace

Result<std::string> TimelineJson(RunDatabase& db, const TimelineOptions& o, TimelineStats* stats) {
  const std::string range =
      " step >= " + std::to_string(o.first_step) + " AND step <= " + std::to_string(o.last_step);
  ASSIGN_OR_RETURN(Table ranks,
                   db.Query("SELECT rank, node, dp, pp, tp, clock_offset_ns, attempt FROM ranks "
                            "GROUP BY rank, attempt ORDER BY pp, dp, tp, attempt"));
  if (ranks.rows.empty()) return NotFound("the run's trace databases list no ranks");
  // Time zero: a whole second before the first span drawn (clock offsets are far smaller).
  ASSIGN_OR_RETURN(Table first, db.Query("SELECT MIN(start_ns) FROM spans WHERE" + range));
  int64_t base_ns = 0;
  if (!first.rows.empty() && !first.is_null[0][0]) {
    base_ns = (std::stoll(first.rows[0][0]) / 1000000000 - 1) * 1000000000;
  }
  return TimelineBuilder(db, o, base_ns).Run(ranks, stats);
}

std::string TimelineHtml(const std::string& trace_json, const TimelineOptions& o) {
  std::string html = kViewerHtml;
  const std::string marker = "/*MEGASCOPE_TRACE*/null";
  const auto at = html.find(marker);
  std::string data = trace_json;
  // Keep "</script>" inside strings from ending the script element.
  for (size_t p = 0; (p = data.find("</", p)) != std::string::npos; p += 3)
    data.replace(p, 2, "<\\/");
  if (at != std::string::npos) html.replace(at, marker.size(), data);
  const auto title = html.find("<title>");
  if (title != std::string::npos) html.insert(title + 7, o.title + " - ");
  return html;
}

}  // namespace megascope::analyzer
