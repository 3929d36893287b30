// `megascope query` (SQL and canned questions over a run's trace databases) and
// `megascope metrics export` (node and training metrics as the detector's CSV).
#include "megascope/analyzer/query.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "command.h"
#include "megascope/analyzer/node_query.h"
#include "megascope/analyzer/store_views.h"
#include "megascope/detector/samples.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/metric_names.h"
#include "megascope/tracer/parallel.h"
#include "megascope/tracer/run_layout.h"

namespace megascope::cli {

namespace {

// "600", "600s", "10m", "2h" as nanoseconds; 0 for anything else.
int64_t DurationNs(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end == nullptr ? "" : end;
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : 0;
  return v > 0 ? static_cast<int64_t>(v * scale * 1e9) : 0;
}

// A TIME of 'at': epoch ns, epoch seconds, or +S seconds after `first_ns` (the run's first span;
// asked only for +S).
Result<int64_t> ParseTime(const std::string& arg,
                          const std::function<Result<int64_t>()>& first_ns) {
  try {
    if (arg[0] == '+') {
      ASSIGN_OR_RETURN(const int64_t first, first_ns());
      return first + static_cast<int64_t>(std::stod(arg.substr(1)) * 1e9);
    }
    const double v = std::stod(arg);
    return v > 1e15 ? static_cast<int64_t>(std::stoll(arg)) : static_cast<int64_t>(v * 1e9);
  } catch (const std::exception&) {
    return InvalidArgument("TIME '" + arg +
                           "' is not a number (epoch ns, epoch seconds or +seconds)");
  }
}

struct Agent {
  std::string node, url;
};

// The agents to ask: --agent URLs as given, or the run's (RUN_DIR/prometheus_targets.json, which
// `megascope launch` keeps current).
Result<std::vector<Agent>> AgentsToAsk(const std::string& run_dir,
                                       const std::vector<std::string>& urls) {
  std::vector<Agent> agents;
  agents.reserve(urls.size());
  for (const std::string& u : urls)
    agents.push_back({u, u.starts_with("http") ? u : "http://" + u});
  if (!agents.empty()) return agents;
  const std::string file = RunLayout(run_dir).prometheus_targets();
  std::ifstream in(file);
  if (!in)
    return NotFound(file +
                    " cannot be read: is this a `megascope launch` run? (or name the agents with "
                    "--agent HOST:PORT)");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  try {
    for (const auto& group : j) {
      const std::string node = group.at("labels").at("megascope_node").get<std::string>();
      for (const auto& t : group.at("targets"))
        agents.push_back({node, "http://" + t.get<std::string>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(file + " is not a Prometheus target list: " + e.what());
  }
  if (agents.empty()) return NotFound(file + " lists no agents");
  return agents;
}

// Asks every agent side by side, with a progress line; the parts of those that answered, and a
// line for each that did not.
std::vector<analyzer::QueryPart> AskAgents(const std::vector<Agent>& agents,
                                           const std::string& path, const std::string& token,
                                           double timeout_s, std::vector<std::string>* missing) {
  std::vector<Result<analyzer::QueryPart>> got(agents.size(),
                                               Status(StatusCode::kInternal, "not asked"));
  std::atomic<size_t> done{0};
  std::mutex print;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  tracer::ParallelFor(agents.size(), 64, [&](size_t i) {
    auto body = tracer::HttpGet(agents[i].url + path, static_cast<int>(timeout_s * 1000), token);
    got[i] =
        body.ok() ? analyzer::ParseQueryPart(*body) : Result<analyzer::QueryPart>(body.status());
    const size_t n = ++done;
    if (tty && (n % 32 == 0 || n == agents.size())) {
      std::lock_guard<std::mutex> lock(print);
      std::fprintf(stderr, "\rquery: %zu of %zu agents answered", n, agents.size());
    }
  });
  std::vector<analyzer::QueryPart> parts;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (got[i].ok()) {
      parts.push_back(std::move(*got[i]));
      if (parts.back().truncated)
        missing->push_back(
            agents[i].node +
            ": answered only its first rows (its agent's row bound): the answer lacks the rest");
    } else {
      missing->push_back(agents[i].node + " (" + agents[i].url + "): " + got[i].status().message());
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "%squery: %zu of %zu agents answered in %.1f s%s\n", tty ? "\r" : "",
               parts.size(), agents.size(), s, missing->empty() ? "" : "; the answer is partial:");
  return parts;
}

// The question over the node databases here (of the time window asked).
Result<analyzer::Table> ReadHere(const std::string& run_dir, const std::string& arg,
                                 analyzer::NodeQuery* q) {
  ASSIGN_OR_RETURN(auto db, analyzer::RunDatabase::Open(run_dir, analyzer::QueryScope(*q)));
  Warn("query", db->warnings());
  switch (q->question) {
    case analyzer::Question::kSteps:
      return db->Query(analyzer::StepsSql());
    case analyzer::Question::kStragglers:
      return db->Query(analyzer::StragglersSql());
    case analyzer::Question::kWaits:
      return db->Query(analyzer::WaitsSql(q->limit));
    case analyzer::Question::kAt: {
      ASSIGN_OR_RETURN(const int64_t t, ParseTime(arg, [&]() -> Result<int64_t> {
                         auto first = db->Query("SELECT MIN(start_ns) FROM spans");
                         if (!first.ok() || first->rows.empty() || first->is_null[0][0])
                           return NotFound("the run has no spans");
                         return std::stoll(first->rows[0][0]);
                       }));
      return db->Query(analyzer::AtSql(t));
    }
    case analyzer::Question::kQuantiles: {
      // The whole run as one part, merged as the agents' parts are: one sketch, one answer.
      ASSIGN_OR_RETURN(analyzer::Table all, db->Query(analyzer::PartSql(*q)));
      return analyzer::MergeParts(*q, {analyzer::QueryPart{"here", std::move(all), false}});
    }
    case analyzer::Question::kSql:
      break;
  }
  return db->Query(q->sql);
}

// The question asked of the agents, their parts merged.
Result<analyzer::Table> AskTheAgents(const std::string& run_dir,
                                     const std::vector<std::string>& urls,
                                     const std::string& token_file, double timeout_s,
                                     const std::string& arg, const std::string& merge,
                                     analyzer::NodeQuery* q) {
  if (q->question == analyzer::Question::kAt) {
    ASSIGN_OR_RETURN(q->at_ns, ParseTime(arg, []() -> Result<int64_t> {
                       return InvalidArgument(
                           "over agents, give 'at' an absolute TIME (epoch seconds or ns), not +S");
                     }));
  }
  ASSIGN_OR_RETURN(const std::vector<Agent> agents, AgentsToAsk(run_dir, urls));
  std::string token;
  const std::string token_path = token_file.empty() ? RunLayout(run_dir).token() : token_file;
  if (!token_file.empty() || std::filesystem::exists(token_path)) {
    ASSIGN_OR_RETURN(token, tracer::ReadToken(token_path));
  }
  std::vector<std::string> missing;
  const auto parts = AskAgents(agents, analyzer::NodeQueryPath(*q), token, timeout_s, &missing);
  Warn("query", missing);
  if (parts.empty()) return Status(StatusCode::kUnavailable, "no agent answered");
  return analyzer::MergeParts(*q, parts, merge);
}

// The question the flags ask (a usage error otherwise).
Result<analyzer::NodeQuery> QuestionOf(const std::string& question, const std::string& sql,
                                       const std::string& arg, const std::string& last,
                                       const std::string& merge, int limit) {
  if (sql.empty() == question.empty())
    return InvalidArgument(
        "give one question (steps, stragglers, waits, at TIME, quantiles [OF]) or --sql");
  analyzer::NodeQuery q;
  q.limit = limit;
  q.sql = sql;
  if (!last.empty()) {
    const int64_t span = DurationNs(last);
    if (span <= 0)
      return InvalidArgument("--last '" + last +
                             "': expected a duration such as 600, 600s, 10m or 2h");
    q.to_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
    q.from_ns = q.to_ns - span;
  }
  const std::map<std::string, analyzer::Question> questions = {
      {"steps", analyzer::Question::kSteps},
      {"stragglers", analyzer::Question::kStragglers},
      {"waits", analyzer::Question::kWaits},
      {"at", analyzer::Question::kAt},
      {"quantiles", analyzer::Question::kQuantiles}};
  q.question = analyzer::Question::kSql;
  if (!question.empty()) {
    auto it = questions.find(question);
    if (it == questions.end())
      return InvalidArgument("unknown question '" + question +
                             "' (steps, stragglers, waits, at TIME, quantiles [OF])");
    q.question = it->second;
  }
  if (q.question == analyzer::Question::kQuantiles && !arg.empty()) {
    const auto& ofs = analyzer::QuantileOfs();
    if (std::find(ofs.begin(), ofs.end(), arg) == ofs.end())
      return InvalidArgument("quantiles of '" + arg +
                             "': expected step, compute, comm_wait or data");
    q.of = arg;
  }
  if (q.question == analyzer::Question::kAt && arg.empty())
    return InvalidArgument("'at' needs a TIME");
  if (!merge.empty() && q.question != analyzer::Question::kSql)
    return InvalidArgument("--merge goes with --sql");
  return q;
}

}  // namespace

// The answer as the flags ask: JSON, CSV or an aligned table.
int PrintTable(const analyzer::Table& table, const po::variables_map& vm) {
  const std::string out = vm.count("json")  ? analyzer::FormatJson(table)
                          : vm.count("csv") ? analyzer::FormatCsv(table)
                                            : analyzer::FormatTable(table);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// `megascope query --store URL VIEW [--job J] [--since 7d]`: a named view answered by the fleet's
// ClickHouse store.
int QueryTheStore(const std::string& store, const std::string& view, const std::string& time,
                  const std::string& job, const std::string& since, int limit,
                  const po::variables_map& vm) {
  auto url = tracer::StoreUrl::Parse(store);
  if (!url.ok()) return Fail("query", url.status().message(), kExitUsage);
  auto v = analyzer::ParseStoreView(view);
  if (!v)
    return Fail("query",
                "unknown view '" + view +
                    "' over a store (steps, stragglers, waits, open, at TIME with --job; "
                    "verdicts, machines, incidents)",
                kExitUsage);
  analyzer::StoreScope scope;
  scope.job = job;
  scope.limit = limit;
  if (!since.empty()) {
    std::string text = since;
    if (text.ends_with('d')) text = std::to_string(std::atof(text.c_str()) * 24) + "h";
    const int64_t span = DurationNs(text);
    if (span <= 0)
      return Fail("query", "--since '" + since + "': expected a duration such as 90m, 12h or 7d",
                  kExitUsage);
    scope.since_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count() -
                     span;
  }
  tracer::ClickHouse ch(*url, 60000);
  if (*v == analyzer::StoreView::kAt) {
    if (time.empty()) return Fail("query", "'at' needs a TIME", kExitUsage);
    auto t = ParseTime(time, [&]() -> Result<int64_t> {
      ASSIGN_OR_RETURN(const std::string first,
                       ch.Scalar("SELECT min(start_ns) FROM spans WHERE job = '" + job + "'"));
      if (first.empty() || first == "0") return NotFound("the store has no spans of job " + job);
      return std::stoll(first);
    });
    if (!t.ok()) return Fail("query", t.status().message(), kExitUsage);
    scope.at_ns = *t;
  }
  auto table = analyzer::QueryStore(ch, *v, scope);
  if (!table.ok()) return Fail("query", table.status().message());
  return PrintTable(*table, vm);
}

int RunQuery(const Args& args) {
  std::string run_dir, sql, question, arg, last, merge, token_file, store, job, since;
  std::vector<std::string> agent_urls;
  int limit = 20;
  double timeout_s = 30;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("run-dir", po::value(&run_dir), "run directory")(
      "store", po::value(&store),
      "answer from the fleet's ClickHouse store (clickhouse://HOST:8123/DB, docs/formats.md "
      "section 4b) instead of a run directory: `megascope query --store URL VIEW`, VIEW one of "
      "steps, stragglers, waits, open (of one job: --job), verdicts, machines (how often and "
      "over how long each machine was named), incidents (by cause, rank and node, across jobs), "
      "at TIME (of one job)")("job", po::value(&job),
                              "with --store: the job whose rows to read (every job's if unset)")(
      "since", po::value(&since),
      "with --store: only rows newer than this (90m, 12h, 7d); whole older days are skipped")(
      "question", po::value(&question), "steps | stragglers | waits | at TIME | quantiles [OF]")(
      "arg", po::value(&arg),
      "TIME for 'at': epoch ns, epoch seconds, or +S seconds after the run's first span; OF for "
      "'quantiles': the per-rank, per-step duration -- step (default), compute, comm_wait or "
      "data -- whose p50, p90, p99 and max are given per attempt (within 1 %, merged by sketch "
      "over agents)")(
      "sql", po::value(&sql),
      "a read-only SQL statement over the views ranks, spans, collectives, heartbeats, metrics, "
      "drops, open_ops, open_collectives, device_spans (docs/formats.md section 4)")(
      "limit", po::value(&limit)->default_value(20), "rows for 'waits'")(
      "last", po::value(&last),
      "only the last DURATION of data (600, 600s, 10m, 2h): what is read, not only shown")(
      "from-agents",
      "ask the run's agents (RUN_DIR/prometheus_targets.json) instead of reading the node "
      "databases here: each answers over its own trace.db, the answers are merged")(
      "agent", po::value(&agent_urls)->composing(),
      "HOST:PORT of an agent to ask (repeat it; implies --from-agents)")(
      "token-file", po::value(&token_file),
      "the run's token for agents that require one (default RUN_DIR/control.token when present)")(
      "timeout", po::value(&timeout_s)->default_value(30),
      "seconds to wait for each agent; those that do not answer are named and left out")(
      "merge", po::value(&merge),
      "with --sql and agents: SQL over table `part` (every agent's rows) giving the answer, "
      "e.g. \"SELECT rank, SUM(n) FROM part GROUP BY rank\" (default: every row)")(
      "csv", "CSV output")("json", "JSON output (an array of objects)");
  po::positional_options_description pos;
  pos.add("run-dir", 1).add("question", 1).add("arg", 1);
  po::variables_map vm;
  if (auto rc = ParseArgs("query",
                          "megascope query RUN_DIR [steps|stragglers|waits|at TIME|quantiles "
                          "[OF]] [--sql SQL] "
                          "[--last 10m] [--from-agents] [--csv|--json]\n       megascope query "
                          "--store clickhouse://HOST:8123/DB VIEW [--job J] [--since 7d]",
                          args, opts, pos, &vm)) {
    return *rc;
  }
  if (!store.empty()) {  // no run directory: the first word is the view
    if (!arg.empty() || !sql.empty())
      return Fail("query", "with --store give one view (and a TIME for 'at'), no --sql",
                  kExitUsage);
    return QueryTheStore(store, run_dir, question, job, since, limit, vm);
  }
  if (run_dir.empty())
    return Fail("query", "the option '--run-dir' is required but missing (or give --store)",
                kExitUsage);
  auto q = QuestionOf(question, sql, arg, last, merge, limit);
  if (!q.ok()) return Fail("query", q.status().message(), kExitUsage);
  const bool remote = vm.count("from-agents") > 0 || !agent_urls.empty();
  Result<analyzer::Table> table =
      remote ? AskTheAgents(run_dir, agent_urls, token_file, timeout_s, arg, merge, &*q)
             : ReadHere(run_dir, arg, &*q);
  if (!table.ok()) return Fail("query", table.status().message());
  return PrintTable(*table, vm);
}

int RunMetrics(const Args& args) {
  std::string action, run_dir, out;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("action", po::value(&action)->required(),
                                                 "the action (export)")(
      "run-dir", po::value(&run_dir)->required(), "run directory")(
      "out,o", po::value(&out)->required(), "CSV to write (timestamp_s,machine,metric,value)");
  po::positional_options_description pos;
  pos.add("action", 1).add("run-dir", 1);
  po::variables_map vm;
  if (auto rc =
          ParseArgs("metrics", "megascope metrics export RUN_DIR -o M.csv", args, opts, pos, &vm))
    return *rc;
  if (action != "export")
    return Fail("metrics", "unknown action '" + action + "' (export)", kExitUsage);
  auto db = analyzer::RunDatabase::Open(run_dir);
  if (!db.ok()) return Fail("metrics", db.status().message());
  Warn("metrics", (*db)->warnings());
  // Node samples as they are; per-rank training metrics ("rank<r>.<name>") averaged per node and
  // second.
  auto t = (*db)->Query(
      "SELECT printf('%.3f', ts_ns / 1e9) AS t, node, name, value FROM metrics WHERE name NOT LIKE "
      "'rank%.%' "
      "UNION ALL SELECT CAST(ts_ns / 1000000000 AS INTEGER), node, substr(name, instr(name, '.') + "
      "1), AVG(value) "
      "FROM metrics WHERE name LIKE 'rank%.%' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3");
  if (!t.ok()) return Fail("metrics", t.status().message());
  auto f = detector::MetricsCsvWriter::Open(out);
  if (!f.ok()) return Fail("metrics", f.status().message());
  // Counters (`_total`) become per-second rates under their `_per_second` name (docs/formats.md
  // section 3): from each sample to the next of the same node; a reset (the agent restarted) starts
  // over.
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> last;  // -> (t, value)
  size_t written = 0;
  for (const auto& row : t->rows) {
    const std::string& name = row[2];
    const double ts = std::atof(row[0].c_str()), v = std::atof(row[3].c_str());
    if (name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) {
      auto [it, first] = last.try_emplace({row[1], name}, ts, v);
      const auto [t0, v0] = it->second;
      it->second = {ts, v};
      if (first || ts <= t0 || v < v0) continue;
      (*f)->Row(ts, row[1], tracer::metrics::ExportName(name), (v - v0) / (ts - t0));
    } else {
      (*f)->Row(ts, row[1], name, v);
    }
    ++written;
  }
  if (Status st = (*f)->Close(); !st.ok()) return Fail("metrics", st.message());
  std::printf("wrote %s: %zu samples from %d node databases\n", out.c_str(), written,
              (*db)->nodes());
  return 0;
}

}  // namespace megascope::cli
