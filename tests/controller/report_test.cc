// The incident report over a run directory written here through the real stores: control.db's
// events of a hang, its eviction and restart, a straggler and a faulty machine; the dumps the hang
// kept (a generated 2x2x2 scenario with stacks added); trace.db spans and metrics of two attempts;
// the progress stream. The markdown and HTML reports are read back and checked for what an SRE
// relies on; the page is rendered in headless Chromium where it is installed.
#include "megascope/controller/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "analyzer/store_run.h"
#include "megascope/controller/control_db.h"
#include "test_util.h"

namespace megascope::controller {
namespace {

namespace fs = std::filesystem;
using megascope::testing::RunCommand;
using nlohmann::json;

constexpr int64_t kMs = 1000000, kS = 1000 * kMs;
constexpr int64_t kT0 = 1'800'000'000 * kS;
constexpr const char* kHangData = MEGASCOPE_TEST_DATA "/hang/not_joined_2x2x2/dumps";

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ = dir_.path() + "/run";
    KeepDumps();
    RecordEvents();
    WriteTraces();
    std::ofstream progress(run_ + "/progress.jsonl");
    for (int attempt = 0; attempt < 2; ++attempt) {
      for (int step = attempt == 0 ? 1 : 3; step <= (attempt == 0 ? 3 : 8); ++step)
        progress << json{{"attempt", attempt},
                         {"step", step},
                         {"loss", 5.0 - 0.3 * step},
                         {"step_time_s", 0.5}}
                        .dump()
                 << "\n";
    }
  }

  // The scenario's dumps as the hang's incident kept them, each rank's main thread's stack added:
  // the root (rank 5) sleeps in the job's own code, the others wait in an all-reduce.
  void KeepDumps() {
    const std::string dir = run_ + "/dumps/attempt_0";
    fs::create_directories(dir);
    for (const auto& f : fs::directory_iterator(kHangData)) {
      std::ifstream in(f.path());
      json d = json::parse(in);
      const bool root = d["rank"] == 5;
      d["stacks"] = json::array(
          {{{"tid", 100},
            {"thread", "main"},
            {"frames",
             root ? json::array({"clock_nanosleep+0x65 (libc.so.6)",
                                 "megascope::Worker::Hang(long)+0x102 (megascope)", "main+0x4"})
                  : json::array({"pthread_cond_clockwait+0x21f (libc.so.6)",
                                 "megascope::Communicator::AllReduce(int)+0x71 (megascope)",
                                 "main+0x4"})}}});
      std::ofstream(dir + "/" + f.path().filename().string()) << d.dump();
    }
  }

  void Record(int64_t at_ms, int attempt, EventKind kind, const std::string& node, int rank,
              json detail) {
    Event e;
    e.ts_ns = kT0 + at_ms * kMs;
    e.attempt = attempt;
    e.kind = kind;
    e.node = node;
    e.rank = rank;
    e.detail = std::move(detail);
    ASSERT_TRUE(db_->Record(e).ok());
  }

  void RecordEvents() {
    auto db = ControlDb::Open(run_ + "/control.db");
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    Record(0, 0, EventKind::kRestart, "", -1,
           {{"cause", "start"},
            {"nodes", {"node0", "node1"}},
            {"resume_step", 0},
            {"source", "none"}});
    Record(3000, 0, EventKind::kFaultInjected, "node1", 5, {{"kind", "hang"}, {"step", 3}});
    Record(6000, 0, EventKind::kTrigger, "", -1,
           {{"cause", "hang"}, {"detail", "no rank's step advanced for 3.1 s (threshold 3.0 s)"}});
    hang_ = {{"kind", "hang"},
             {"cause", "rank_not_joined"},
             {"root_ranks", {5}},
             {"root_nodes", {"node1"}},
             {"confidence", 0.9},
             {"detected_at_ns", kT0 + 6001 * kMs},
             {"explanation", "rank 5 never issued allreduce #9 in dp.1.0"},
             {"evidence",
              {"rank 5 (node1, dp=1 pp=0 tp=1) from http://127.0.0.1:41323/dumps?form=binary"
               "&attempt=0 dump 1"}}};
    Record(6001, 0, EventKind::kVerdict, "node1", 5, hang_);
    Record(6500, 0, EventKind::kStopped, "", -1, {{"seconds", 0.5}});
    Record(
        6501, 0, EventKind::kDecision, "node1", 5,
        {{"action", "evict"}, {"reason", "a rank of the node never joined"}, {"verdict", hang_}});
    Record(6502, 0, EventKind::kEviction, "node1", -1,
           {{"reason", "rank_not_joined"}, {"verdict", hang_}});
    Record(7000, 0, EventKind::kSelfCheck, "node2", -1,
           {{"passed", true},
            {"why", "spare for node1"},
            {"gemm_gflops", 20.0},
            {"allreduce_gbps", 0.5}});
    Record(7200, 1, EventKind::kRestart, "", -1,
           {{"cause", "rank_not_joined"},
            {"nodes", {"node0", "node2"}},
            {"resume_step", 2},
            {"source", "memory"},
            {"steps_lost", 1}});
    Record(7500, 1, EventKind::kCheckpointLoaded, "", -1,
           {{"step", 2}, {"source", "memory"}, {"rendezvous_s", 0.1}, {"load_s", 0.1}});
    Record(7800, 1, EventKind::kResumed, "", -1, {{"step", 3}});
    // A straggler the policy acted on (with the window and thresholds that decided it), one it
    // only alerted on, and a faulty machine.
    const json slow = {
        {"kind", "slow"},
        {"cause", "compute_straggler"},
        {"root_ranks", {2}},
        {"confidence", 0.7},
        {"detected_at_ns", kT0 + 12000 * kMs},
        {"explanation", "rank 2 computed 2x its peers"},
        {"evidence", {"slow_steps=4", "thresholds: steps 3..8 of attempt 1"}},
        {"thresholds",
         {{"attempt", 1}, {"first_step", 3}, {"last_step", 8}, {"compute_ratio", 1.2}}}};
    Record(12000, 1, EventKind::kVerdict, "node2", 2, slow);
    Record(12001, 1, EventKind::kDecision, "node2", 2,
           {{"action", "self_check"}, {"reason", "a persistent straggler"}, {"verdict", slow}});
    json alerted = slow;
    alerted["cause"] = "comm_straggler";
    alerted["detected_at_ns"] = kT0 + 13000 * kMs;
    alerted["explanation"] = "rank 1 arrived last at 3 collectives";
    Record(13000, 1, EventKind::kVerdict, "node0", 1, alerted);
    Record(13001, 1, EventKind::kDecision, "node0", 1,
           {{"action", "alert"}, {"reason", "seen once"}, {"verdict", alerted}});
    const json machine = {{"kind", "faulty_machine"},
                          {"cause", "metric_outlier"},
                          {"confidence", 0.72},
                          {"detected_at_ns", kT0 + 14000 * kMs},
                          {"explanation", "node2 stood out from its peers"},
                          {"evidence", {"node_network_receive_errors_total nonzero"}}};
    Record(14000, 1, EventKind::kVerdict, "node2", -1, machine);
    Record(14001, 1, EventKind::kDecision, "node2", -1,
           {{"action", "evict"}, {"reason", "confirmed"}, {"verdict", machine}});
    Record(15000, 1, EventKind::kJobFinished, "", -1, {{"status", "finished"}, {"steps", 8}});
  }

  // Four data-parallel ranks, steps 1..3 in attempt 0 and 3..8 in attempt 1 (rank 2 on node2, the
  // spare, computing twice as long), and each node's receive-error counter (node2's rising).
  void WriteTraces() {
    for (int attempt = 0; attempt < 2; ++attempt) {
      for (int rank = 0; rank < 4; ++rank) {
        tracer::RankInfo info;
        info.job = "j";
        info.rank = rank;
        info.world_size = 4;
        info.attempt = attempt;
        info.coords.dp = rank;
        info.node = rank < 2 ? "node0" : (attempt == 0 ? "node1" : "node2");
        std::vector<tracer::Record> recs;
        for (int step = attempt == 0 ? 1 : 3; step <= (attempt == 0 ? 3 : 8); ++step) {
          const int64_t t = kT0 + step * kS;
          const int64_t fwd = attempt == 1 && rank == 2 ? 200 * kMs : 100 * kMs;
          tracer::Record span{};
          span.span = {tracer::RecordType::kSpan,
                       tracer::SpanKind::kForward,
                       0,
                       -1,
                       step,
                       t,
                       t + fwd,
                       0,
                       0,
                       0,
                       0,
                       0,
                       {}};
          recs.push_back(span);
        }
        analyzer::WriteRankRecords(run_, info, {"forward"},
                                   {tracer::GroupInfo{"dp.0", "dp", {0, 1, 2, 3}}}, recs);
      }
    }
    for (const char* node : {"node0", "node2"}) {
      std::vector<tracer::MetricRow> rows;
      for (int s = -20; s <= 5; ++s) {
        const bool bad = std::string(node) == "node2" && s > -10;
        rows.push_back({node, kT0 + (14 + s) * kS, "node_network_receive_errors_total",
                        bad ? 100.0 * (s + 10) : 0.0});
      }
      auto store = tracer::TraceStore::Open(run_ + "/nodes/" + node + "/trace.db");
      ASSERT_TRUE(store.ok());
      ASSERT_TRUE((*store)->Write({}, rows, {}).ok());
    }
  }

  std::string Page() {
    auto page = BuildHtmlReport(run_);
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    return page.ok() ? *page : "";
  }
  // The element with id `id` (its whole text, up to its closing tag).
  static std::string Element(const std::string& page, const std::string& tag,
                             const std::string& id) {
    const size_t at = page.find("<" + tag + " id=\"" + id + "\"");
    if (at == std::string::npos) return "";
    return page.substr(at, page.find("</" + tag + ">", at) - at);
  }

  megascope::testing::TempDir dir_;
  std::string run_;
  std::unique_ptr<ControlDb> db_;
  json hang_;
};

TEST_F(ReportTest, TheMarkdownReportListsEveryStageAndTheCost) {
  ReportFigures f;
  auto md = BuildReport(run_, &f);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(f.incidents, 1);
  EXPECT_EQ(f.evictions, 1);
  EXPECT_NE(md->find("| fault injected | -3.00 s | hang injected on rank 5 (node1) at step 3 |"),
            std::string::npos)
      << *md;
  EXPECT_NE(md->find("| eviction | +0.50 s | **node1 evicted: rank_not_joined** |"),
            std::string::npos)
      << *md;
  EXPECT_NE(md->find("1 step(s) lost**"), std::string::npos) << *md;
  EXPECT_NE(md->find("| resumed (first step done) | +1.80 s | step 3 done |"), std::string::npos);
}

TEST_F(ReportTest, TheStagesAreATableAndTheIncidentsCostIsSummed) {
  const std::string page = Page();
  EXPECT_EQ(page.find("<pre>"), std::string::npos) << "no raw markdown";
  EXPECT_EQ(page.find("| stage |"), std::string::npos);
  const std::regex row(
      "<tr class=\"key\"><td>eviction</td><td class=\"num\">\\+0\\.50 s</td>"
      "<td>node1 evicted: rank_not_joined</td></tr>");
  EXPECT_TRUE(std::regex_search(page, row)) << page.substr(0, 4000);
  // The overview: detected 3.00 s after the fault, training again 1.80 s after the trigger, one
  // step lost.
  const std::string overview = Element(page, "table", "incidents");
  EXPECT_NE(overview.find("<td class=\"num\">3.00 s</td><td class=\"num\">1.80 s</td><td "
                          "class=\"num\">1</td>"),
            std::string::npos)
      << overview;
}

TEST_F(ReportTest, EventLanesFollowTheIncidentWithATickedAxisRestartsAndReadableTooltips) {
  const std::string events = Element(Page(), "svg", "events");
  ASSERT_FALSE(events.empty());
  // Only kinds that occurred, in the order an incident goes through them.
  EXPECT_EQ(events.find(">paused<"), std::string::npos) << "no empty lane";
  const size_t fault = events.find(">fault_injected<"), trigger = events.find(">trigger<"),
               eviction = events.find(">eviction<"), restart = events.find(">restart<");
  ASSERT_NE(fault, std::string::npos);
  EXPECT_LT(fault, trigger);
  EXPECT_LT(trigger, eviction);
  EXPECT_LT(eviction, restart);
  // Ticks every 2 s over the 15 s run, and the restart of attempt 1 marked.
  for (const char* tick : {">0 s<", ">2 s<", ">8 s<", ">14 s<"})
    EXPECT_NE(events.find(tick), std::string::npos) << tick;
  EXPECT_NE(events.find("class=\"marker\""), std::string::npos);
  EXPECT_NE(events.find(">attempt 1<"), std::string::npos);
  // Tooltips are sentences, never a JSON object cut short.
  const std::regex title("<title>([^<]*)</title>");
  int titles = 0;
  for (auto it = std::sregex_iterator(events.begin(), events.end(), title);
       it != std::sregex_iterator(); ++it, ++titles) {
    const std::string text = (*it)[1];
    EXPECT_EQ(text.find("{&quot;"), std::string::npos) << text;
  }
  EXPECT_GE(titles, 16);
  EXPECT_NE(events.find("evict node1: a rank of the node never joined"), std::string::npos);
}

TEST_F(ReportTest, AHangShowsItsWaitForGraphAndStacksAndLinksTheKeptDump) {
  const std::string page = Page();
  EXPECT_EQ(page.find("http://127.0.0.1"), std::string::npos) << "no agent URL";
  EXPECT_NE(page.find("<a href=\"dumps/attempt_0/rank_5.json\">"), std::string::npos);
  // The graph, re-derived from the kept dumps: rank 5 the root, an arrow into it from a rank that
  // waits on it.
  const size_t graph = page.find("<svg class=\"waitfor\"");
  ASSERT_NE(graph, std::string::npos);
  const std::string svg = page.substr(graph, page.find("</svg>", graph) - graph);
  EXPECT_NE(svg.find("<g class=\"gnode root\"><rect"), std::string::npos);
  EXPECT_TRUE(std::regex_search(svg, std::regex("gnode root\"><rect[^>]*/><text[^>]*><tspan "
                                                "font-weight=\"bold\">rank 5</tspan>")))
      << svg;
  EXPECT_TRUE(std::regex_search(svg, std::regex("<title>rank \\d waits in [^<]* for rank 5 \\(")))
      << svg;
  // The root's stack first, apart from the others'.
  const size_t own = page.find("the root's: rank 5</b>");
  ASSERT_NE(own, std::string::npos);
  EXPECT_LT(own, page.find("Worker::Hang"));
  EXPECT_LT(page.find("Worker::Hang"), page.find("Communicator::AllReduce"));
}

TEST_F(ReportTest, AStragglerShowsItsComputeAgainstItsPeersAndOnlyActedOnVerdictsGetACard) {
  const std::string page = Page();
  // The acted-on straggler: its thresholds as a table and its window plotted, rank 2 in red.
  EXPECT_NE(page.find("<th class=\"num\">first_step</th>"), std::string::npos);
  EXPECT_NE(page.find("Its compute per step against its peers at pp 0, tp 0"), std::string::npos);
  EXPECT_NE(page.find("<i style=\"background:#d62728\"></i>rank 2 (node2), the one named"),
            std::string::npos);
  // Steps 3..8 of attempt 1: rank 2's points at 0.2 s.
  EXPECT_TRUE(
      std::regex_search(page, std::regex("rank 2 \\(node2\\), the one named\nstep \\(attempt "
                                         "1\\): 5\ncompute \\(s\\): 0.2<")))
      << "the named rank's compute in its window";
  // The alert-only one is a row of the table, not a card.
  const std::string others = Element(page, "table", "other-verdicts");
  EXPECT_NE(others.find("rank 1 arrived last at 3 collectives"), std::string::npos);
  EXPECT_EQ(page.find("<h3>slow: comm_straggler"), std::string::npos);
  // Its heat-map row is marked, on the node it ran on when it was named.
  EXPECT_NE(page.find("row-suspect\">rank 2 dp2 pp0 tp0 node2<"), std::string::npos);
  EXPECT_EQ(page.find("row-suspect\">rank 2 dp2 pp0 tp0 node1<"), std::string::npos);
  EXPECT_EQ(page.find("row-suspect\">rank 1 "), std::string::npos) << "an alert marks nothing";
}

TEST_F(ReportTest, AFaultyMachineShowsItsMetricAgainstItsPeers) {
  const std::string page = Page();
  const size_t card = page.find("<h3>faulty_machine: metric_outlier &mdash; node2</h3>");
  ASSERT_NE(card, std::string::npos);
  const std::string rest = page.substr(card);
  EXPECT_NE(rest.find("node_network_receive_errors"), std::string::npos);
  EXPECT_NE(rest.find("node2 (named)"), std::string::npos);
  EXPECT_NE(rest.find(">seconds from the verdict<"), std::string::npos);
  // The named node's rate as the detector saw it: 100 errors a second.
  EXPECT_TRUE(std::regex_search(rest, std::regex("node2 \\(named\\)\nseconds from the verdict: "
                                                 "-?\\d+\nper second: 100<")));
}

TEST_F(ReportTest, TheHeatMapAndLossHaveAxesScalesLegendsAndRestarts) {
  const std::string page = Page();
  const std::string heat = Element(page, "svg", "heatmap");
  EXPECT_NE(heat.find(">attempt 1 resumes<"), std::string::npos);
  EXPECT_NE(heat.find(">step<"), std::string::npos);
  EXPECT_NE(page.find("id=\"heatscale\""), std::string::npos);
  EXPECT_NE(page.find(">2.0x+<"), std::string::npos);
  const std::string loss = Element(page, "svg", "loss");
  ASSERT_FALSE(loss.empty());
  EXPECT_NE(loss.find(">loss (cross-entropy)<"), std::string::npos);
  EXPECT_NE(loss.find(">step<"), std::string::npos);
  EXPECT_NE(loss.find("class=\"marker\""), std::string::npos);
  for (const char* key : {"</i>attempt 0</span>", "</i>attempt 1</span>"})
    EXPECT_NE(page.find(key), std::string::npos) << key;
  // Self-contained and printable.
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("src=\"http"), std::string::npos);
  EXPECT_NE(page.find("@media print"), std::string::npos);
}

TEST_F(ReportTest, ThePageRendersInChromiumOnScreenAndInPrint) {
  if (RunCommand("command -v chromium").code != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  const std::string html = run_ + "/report.html";
  std::ofstream(html) << Page();
  const std::string chromium =
      "timeout 60 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-sync "
      "--user-data-dir=" +
      dir_.path() + "/chrome ";
  auto dom = RunCommand(chromium + "--dump-dom file://" + html + " 2>/dev/null");
  ASSERT_EQ(dom.code, 0);
  // The browser's own parse keeps every section's figure.
  for (const char* id : {"id=\"summary\"", "id=\"incidents\"", "class=\"waitfor\"", "id=\"events\"",
                         "id=\"heatmap\"", "id=\"loss\""})
    EXPECT_NE(dom.out.find(id), std::string::npos) << id;
  auto pdf = RunCommand(chromium + "--no-pdf-header-footer --print-to-pdf=" + run_ +
                        "/report.pdf file://" + html + " 2>&1");
  EXPECT_EQ(pdf.code, 0) << pdf.out;
  EXPECT_GT(fs::file_size(run_ + "/report.pdf"), 20000u) << "a printed page, not a blank one";
}

}  // namespace
}  // namespace megascope::controller
