#include "megascope/analyzer/timeline.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

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

Result<std::string> TimelineJson(RunDatabase& db, const TimelineOptions& o, TimelineStats* stats) {
  const std::string range =
      " step >= " + std::to_string(o.first_step) + " AND step <= " + std::to_string(o.last_step);
  // A rank is drawn under the node it ran on in each attempt (a restart may move it to a spare),
  // with that attempt's clock offset.
  ASSIGN_OR_RETURN(Table ranks,
                   db.Query("SELECT rank, node, dp, pp, tp, clock_offset_ns, attempt FROM ranks "
                            "GROUP BY rank, attempt ORDER BY pp, dp, tp, attempt"));
  if (ranks.rows.empty()) return NotFound("the run's trace databases list no ranks");
  using RankAttempt = std::pair<int, int>;
  std::map<RankAttempt, int64_t> offset;
  std::map<std::string, int> node_pid;
  std::map<RankAttempt, int> rank_pid;
  std::set<std::pair<int, int>> threads;  // (pid, rank) named so far
  std::set<int> distinct_ranks;
  std::string out;
  out.reserve(1 << 20);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"title\":";
  AppendStr(out, o.title);
  out +=
      ",\"highlight_ranks\":" + nlohmann::json(o.highlight_ranks).dump() + "},\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const auto& row : ranks.rows) {
    const int rank = std::stoi(row[0]), attempt = row[6].empty() ? 0 : std::stoi(row[6]);
    distinct_ranks.insert(rank);
    offset[{rank, attempt}] = row[5].empty() ? 0 : std::stoll(row[5]);
    auto [it, added] = node_pid.try_emplace(row[1], static_cast<int>(node_pid.size()));
    rank_pid[{rank, attempt}] = it->second;
    if (added) {
      sep();
      out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(it->second) +
             ",\"tid\":0,\"args\":{\"name\":";
      AppendStr(out, row[1]);
      out += "}}";
    }
    if (!threads.insert({it->second, rank}).second) continue;
    sep();
    const std::string label =
        "rank " + row[0] + " (dp=" + row[2] + ", pp=" + row[3] + ", tp=" + row[4] + ")";
    out += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(it->second) +
           ",\"tid\":" + row[0] + ",\"args\":{\"name\":\"" + label + "\",\"dp\":" + row[2] +
           ",\"pp\":" + row[3] + ",\"tp\":" + row[4] + "}}";
    sep();
    out += "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + std::to_string(it->second) +
           ",\"tid\":" + row[0] +
           ",\"args\":{\"sort_index\":" + std::to_string(threads.size() - 1) + "}}";
  }
  int64_t t_min = std::numeric_limits<int64_t>::max(), t_max = 0, nspans = 0;
  RETURN_IF_ERROR(
      db.Scan("SELECT rank, step, microbatch, kind, name, start_ns, end_ns, attempt FROM spans "
              "WHERE" +
                  range + " ORDER BY start_ns",
              [&](const RunDatabase::Row& row) {
                const int rank = static_cast<int>(row.Int(0));
                const RankAttempt key{rank, static_cast<int>(row.Int(7))};
                auto pid = rank_pid.find(key);
                if (pid == rank_pid.end()) return;
                const int64_t start = row.Int(5) - offset[key], end = row.Int(6) - offset[key];
                t_min = std::min(t_min, start);
                t_max = std::max(t_max, end);
                ++nspans;
                sep();
                out += "{\"ph\":\"X\",\"name\":";
                AppendStr(out, std::string(row.Text(4)));
                out += ",\"cat\":\"";
                out += row.Text(3);
                out += "\",\"ts\":";
                AppendNum(out, static_cast<double>(start) / 1000.0);
                out += ",\"dur\":";
                AppendNum(out, static_cast<double>(end - start) / 1000.0);
                out += ",\"pid\":";
                AppendInt(out, pid->second);
                out += ",\"tid\":";
                AppendInt(out, rank);
                out += ",\"args\":{\"step\":";
                AppendInt(out, row.Int(1));
                out += ",\"attempt\":";
                AppendInt(out, key.second);
                if (!row.IsNull(2)) {
                  out += ",\"microbatch\":";
                  AppendInt(out, row.Int(2));
                }
                out += "}}";
              }));
  // Ops still open when their rank's agent last looked (a hang, or the ops a rank died in): a slice
  // from when the op started on the rank (or was issued) to when it was last seen open, so the
  // hung step is not a blank. With steps chosen, those issued within the drawn spans' time.
  int64_t nopen = 0;
  const bool all_steps = o.first_step <= 0 && o.last_step == std::numeric_limits<int64_t>::max();
  RETURN_IF_ERROR(db.Scan(
      "SELECT rank, attempt, op, grp, seq, peer, state, enqueued_ns, started_ns, seen_ns FROM "
      "open_collectives ORDER BY enqueued_ns",
      [&](const RunDatabase::Row& row) {
        const RankAttempt key{static_cast<int>(row.Int(0)), static_cast<int>(row.Int(1))};
        auto pid = rank_pid.find(key);
        if (pid == rank_pid.end()) return;
        const int64_t issued = row.Int(7);
        if (!all_steps && (nspans == 0 || issued < t_min + offset[key] - 1000000000 ||
                           issued > t_max + offset[key] + 1000000000))
          return;
        const int64_t from = (row.IsNull(8) ? issued : row.Int(8)) - offset[key];
        const int64_t to = std::max(from, row.Int(9) - offset[key]);
        t_min = std::min(t_min, from);
        t_max = std::max(t_max, to);
        ++nopen;
        sep();
        out += "{\"ph\":\"X\",\"name\":";
        AppendStr(out, std::string(row.Text(2)) + " (open)");
        out += ",\"cat\":\"open\",\"ts\":";
        AppendNum(out, static_cast<double>(from) / 1000.0);
        out += ",\"dur\":";
        AppendNum(out, static_cast<double>(to - from) / 1000.0);
        out += ",\"pid\":";
        AppendInt(out, pid->second);
        out += ",\"tid\":";
        AppendInt(out, key.first);
        out += ",\"args\":{\"attempt\":";
        AppendInt(out, key.second);
        out += ",\"group\":";
        AppendStr(out, std::string(row.Text(3)));
        out += ",\"seq\":";
        AppendInt(out, row.Int(4));
        if (row.Int(5) >= 0) {
          out += ",\"peer\":";
          AppendInt(out, row.Int(5));
        }
        out += ",\"state\":";
        AppendStr(out, std::string(row.Text(6)));
        out += ",\"open\":true}}";
      }));
  int64_t flows = 0;
  if (nspans > 0) {
    // Pipeline transfers: the k-th send from a to b in a group matches the k-th recv on b from a.
    ASSIGN_OR_RETURN(Table p2p,
                     db.Query("SELECT s.rank, r.rank, s.started_ns, r.completed_ns, s.attempt FROM "
                              "collectives s JOIN collectives r "
                              "ON s.grp = r.grp AND s.seq = r.seq AND s.op = 'send' AND r.op = "
                              "'recv' AND r.peer = s.rank AND s.peer = r.rank "
                              "AND s.attempt = r.attempt WHERE s.started_ns >= " +
                              std::to_string(t_min) + " - 1000000000 AND r.completed_ns <= " +
                              std::to_string(t_max) + " + 1000000000 ORDER BY s.started_ns"));
    for (const auto& row : p2p.rows) {
      const int attempt = row[4].empty() ? 0 : std::stoi(row[4]);
      const RankAttempt from{std::stoi(row[0]), attempt}, to{std::stoi(row[1]), attempt};
      if (!rank_pid.count(from) || !rank_pid.count(to) || row[2].empty() || row[3].empty())
        continue;
      const std::string id = std::to_string(++flows);
      sep();
      out += "{\"ph\":\"s\",\"name\":\"p2p\",\"cat\":\"pipeline\",\"id\":" + id +
             ",\"pid\":" + std::to_string(rank_pid[from]) + ",\"tid\":" + row[0] + ",\"ts\":";
      AppendNum(out, static_cast<double>(std::stoll(row[2]) - offset[from]) / 1000.0);
      out += "},\n{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"p2p\",\"cat\":\"pipeline\",\"id\":" + id +
             ",\"pid\":" + std::to_string(rank_pid[to]) + ",\"tid\":" + row[1] + ",\"ts\":";
      AppendNum(out, static_cast<double>(std::stoll(row[3]) - offset[to]) / 1000.0);
      out += "}";
    }
  }
  out += "\n]}\n";
  if (stats != nullptr)
    *stats = {nspans, flows, static_cast<int64_t>(distinct_ranks.size()), nopen};
  return out;
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
