// `megascope query` (SQL and canned questions over a run's trace databases) and
// `megascope metrics export` (node and training metrics as the detector's CSV).
#include "megascope/analyzer/query.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include "command.h"
#include "megascope/detector/samples.h"
#include "megascope/tracer/metric_names.h"

namespace megascope::cli {

int RunQuery(const Args& args) {
  std::string run_dir, sql, question, arg;
  int limit = 20;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("run-dir", po::value(&run_dir)->required(),
                                                 "run directory")(
      "question", po::value(&question), "steps | stragglers | waits | at TIME")(
      "arg", po::value(&arg),
      "TIME for 'at': epoch ns, epoch seconds, or +S seconds after the run's first span")(
      "sql", po::value(&sql),
      "a read-only SQL statement over the views ranks, spans, collectives, heartbeats, metrics, "
      "drops, open_ops, open_collectives, device_spans (docs/formats.md section 4)")(
      "limit", po::value(&limit)->default_value(20), "rows for 'waits'")("csv", "CSV output")(
      "json", "JSON output (an array of objects)");
  po::positional_options_description pos;
  pos.add("run-dir", 1).add("question", 1).add("arg", 1);
  po::variables_map vm;
  if (auto rc = ParseArgs(
          "query",
          "megascope query RUN_DIR [steps|stragglers|waits|at TIME] [--sql SQL] [--csv|--json]",
          args, opts, pos, &vm)) {
    return *rc;
  }
  if (sql.empty() == question.empty())
    return Fail("query", "give one question (steps, stragglers, waits, at TIME) or --sql",
                kExitUsage);
  auto db = analyzer::RunDatabase::Open(run_dir);
  if (!db.ok()) return Fail("query", db.status().message());
  Warn("query", (*db)->warnings());
  if (question == "steps") {
    sql = analyzer::StepsSql();
  } else if (question == "stragglers") {
    sql = analyzer::StragglersSql();
  } else if (question == "waits") {
    sql = analyzer::WaitsSql(limit);
  } else if (question == "at") {
    if (arg.empty()) return Fail("query", "'at' needs a TIME", kExitUsage);
    int64_t t = 0;
    try {
      if (arg[0] == '+') {
        auto first = (*db)->Query("SELECT MIN(start_ns) FROM spans");
        if (!first.ok() || first->rows.empty() || first->is_null[0][0])
          return Fail("query", "the run has no spans");
        t = std::stoll(first->rows[0][0]) + static_cast<int64_t>(std::stod(arg.substr(1)) * 1e9);
      } else {
        const double v = std::stod(arg);
        t = v > 1e15 ? static_cast<int64_t>(std::stoll(arg)) : static_cast<int64_t>(v * 1e9);
      }
    } catch (const std::exception&) {
      return Fail("query",
                  "TIME '" + arg + "' is not a number (epoch ns, epoch seconds or +seconds)",
                  kExitUsage);
    }
    sql = analyzer::AtSql(t);
  } else if (!question.empty()) {
    return Fail("query", "unknown question '" + question + "' (steps, stragglers, waits, at TIME)",
                kExitUsage);
  }
  auto table = (*db)->Query(sql);
  if (!table.ok()) return Fail("query", table.status().message());
  const std::string out = vm.count("json")  ? analyzer::FormatJson(*table)
                          : vm.count("csv") ? analyzer::FormatCsv(*table)
                                            : analyzer::FormatTable(*table);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int RunMetrics(const Args& args) {
  std::string action, run_dir, out;
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")("action", po::value(&action)->required(),
                                                 "export")(
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
