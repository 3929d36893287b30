// Timeline export on a real run: valid Chrome trace-event JSON, and the HTML viewer rendered by
// headless Chromium with one row per rank and no script errors (a screenshot is kept).
#include "megascope/analyzer/timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "megascope/runtime/data.h"
#include "test_util.h"

namespace megascope::analyzer {
namespace {

using megascope::testing::RunCommand;
using megascope::testing::TempDir;

class TimelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string data = dir_->path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data).ok());
    auto r = RunCommand(std::string(MEGASCOPE_BIN) +
                        " train --dp 2 --tp 2 --pp 2 --nodes 2 --data " + data + " --run-dir " +
                        dir_->path() + "/run --job tl" + std::to_string(::getpid()) +
                        " --steps 4 --layers 2 --width 32 --heads 2 --seq 16 --batch 4");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
};
TempDir* TimelineTest::dir_ = nullptr;

// What Perfetto's and Chrome's importers need to draw the trace as meant: slices on one thread
// nest (none partly overlaps another: asynchronous sends have threads of their own), every flow
// end lies inside a slice of its thread (bp "e" binds to the enclosing slice), and timestamps are
// relative (epoch microseconds in a double lose the nanoseconds). Returns what is wrong, "" if
// nothing.
std::string ValidateTraceEvents(const nlohmann::json& j) {
  if (!j.contains("traceEvents") || !j["traceEvents"].is_array()) return "no traceEvents array";
  struct Slice {
    double from, to;
    std::string name;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<Slice>> slices;  // (pid, tid) -> slices
  std::vector<const nlohmann::json*> flow_ends;
  for (const auto& e : j["traceEvents"]) {
    if (!e.contains("ph") || !e.contains("pid") || !e.contains("tid")) return "event " + e.dump();
    const std::string ph = e["ph"];
    if (ph == "X") {
      const double ts = e["ts"], dur = e["dur"];
      if (dur < 0) return "negative duration: " + e.dump();
      if (ts > 1e11) return "absolute (epoch) timestamp: " + e.dump();
      slices[{e["pid"], e["tid"]}].push_back({ts, ts + dur, e["name"]});
    } else if (ph == "s" || ph == "f") {
      if (e.value("bp", "") != "e") return "flow not bound to its enclosing slice: " + e.dump();
      flow_ends.push_back(&e);
    }
  }
  constexpr double kEps = 0.0005;  // the writer's rounding, in microseconds
  for (auto& [thread, v] : slices) {
    std::sort(v.begin(), v.end(), [](const Slice& a, const Slice& b) {
      return a.from < b.from || (a.from == b.from && a.to > b.to);
    });
    std::vector<const Slice*> open;
    for (const Slice& s : v) {
      while (!open.empty() && open.back()->to <= s.from + kEps) open.pop_back();
      if (!open.empty() && s.to > open.back()->to + kEps) {
        return "on pid " + std::to_string(thread.first) + " tid " + std::to_string(thread.second) +
               " '" + s.name + "' [" + std::to_string(s.from) + ", " + std::to_string(s.to) +
               "] partly overlaps '" + open.back()->name + "' [" +
               std::to_string(open.back()->from) + ", " + std::to_string(open.back()->to) + "]";
      }
      open.push_back(&s);
    }
  }
  for (const nlohmann::json* e : flow_ends) {
    const double ts = (*e)["ts"];
    const auto& v = slices[{(*e)["pid"], (*e)["tid"]}];
    if (std::none_of(v.begin(), v.end(),
                     [ts](const Slice& s) { return s.from <= ts && ts <= s.to; }))
      return "a flow end outside every slice of its thread: " + e->dump();
  }
  return "";
}

TEST(TraceEventValidatorTest, CatchesWhatImportersMisdraw) {
  auto x = [](double ts, double dur, int tid) {
    return nlohmann::json{{"ph", "X"},  {"name", "s"}, {"ts", ts},
                          {"dur", dur}, {"pid", 0},    {"tid", tid}};
  };
  nlohmann::json ok = {{"traceEvents", {x(0, 10, 1), x(2, 3, 1), x(10, 5, 1), x(4, 20, 2)}}};
  EXPECT_EQ(ValidateTraceEvents(ok), "");
  nlohmann::json overlap = {{"traceEvents", {x(0, 10, 1), x(5, 10, 1)}}};
  EXPECT_NE(ValidateTraceEvents(overlap).find("partly overlaps"), std::string::npos);
  nlohmann::json epoch = {{"traceEvents", {x(1.7637e15, 10, 1)}}};
  EXPECT_NE(ValidateTraceEvents(epoch).find("absolute"), std::string::npos);
  nlohmann::json loose = ok;
  loose["traceEvents"].push_back(
      {{"ph", "s"}, {"bp", "e"}, {"id", 1}, {"ts", 30.0}, {"pid", 0}, {"tid", 1}});
  EXPECT_NE(ValidateTraceEvents(loose).find("outside every slice"), std::string::npos);
}

TEST_F(TimelineTest, JsonFollowsTheTraceEventFormat) {
  const std::string out = dir_->path() + "/t.json";
  auto r = RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() +
                      "/run --steps 1:2 -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out);
  auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j["traceEvents"].is_array());
  EXPECT_EQ(ValidateTraceEvents(j), "");
  EXPECT_GT(j["otherData"]["base_ns"].get<int64_t>(), 1700000000LL * 1000000000LL);
  std::set<std::string> rank_threads;  // "pid/tid"
  int send_threads = 0;
  std::set<int64_t> starts, finishes;
  std::set<int64_t> steps;
  int spans = 0, transfers = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "X") {
      ++spans;
      for (const char* k : {"name", "ts", "dur", "cat", "args"}) EXPECT_TRUE(e.contains(k)) << k;
      steps.insert(e["args"]["step"].get<int64_t>());
      EXPECT_TRUE(e["args"].contains("attempt")) << e.dump();
      if (e["name"] == "send" || e["name"] == "recv") {
        ++transfers;
        for (const char* k : {"group", "seq", "peer", "bytes"})
          EXPECT_TRUE(e["args"].contains(k)) << k << " in " << e.dump();
      }
    } else if (ph == "M" && e["name"] == "thread_name") {
      const std::string name = e["args"]["name"];
      if (std::regex_match(name, std::regex(R"(rank \d+ sends( \(\d+\))?)"))) {
        ++send_threads;
        continue;
      }
      EXPECT_TRUE(std::regex_match(name, std::regex(R"(rank \d+ \(dp=\d+, pp=\d+, tp=\d+\))")))
          << name;
      rank_threads.insert(std::to_string(e["pid"].get<int>()) + "/" +
                          std::to_string(e["tid"].get<int>()));
    } else if (ph == "s") {
      starts.insert(e["id"].get<int64_t>());
    } else if (ph == "f") {
      finishes.insert(e["id"].get<int64_t>());
    }
  }
  EXPECT_EQ(rank_threads.size(), 8u);  // one thread per rank
  EXPECT_GE(send_threads, 4);          // the sending stages' ranks send on threads of their own
  EXPECT_GT(spans, 0);
  EXPECT_GT(transfers, 0);
  EXPECT_EQ(steps, (std::set<int64_t>{1, 2}));  // the flows' slices too: only the steps asked
  EXPECT_FALSE(starts.empty());
  EXPECT_EQ(starts, finishes);  // every flow arrow starts and ends
}

TEST_F(TimelineTest, HtmlViewerRendersOneRowPerRankInHeadlessChromium) {
  const std::string html = dir_->path() + "/t.html", png = dir_->path() + "/t.png";
  ASSERT_EQ(RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() + "/run --html " +
                       html + " --highlight 5")
                .code,
            0);
  const std::string chromium =
      "chromium --headless --no-sandbox --disable-gpu --disable-background-networking "
      "--disable-component-update --no-first-run --disable-sync --user-data-dir=" +
      dir_->path() + "/chrome ";
  if (RunCommand("command -v chromium").code != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  auto dom = RunCommand("timeout 60 " + chromium + "--dump-dom file://" + html + " 2>/dev/null");
  ASSERT_EQ(dom.code, 0) << dom.out;
  EXPECT_NE(dom.out.find("data-ranks=\"8\""), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_NE(dom.out.find("data-nodes=\"2\""), std::string::npos);
  EXPECT_EQ(dom.out.find("data-error"), std::string::npos) << "the viewer raised a script error";
  auto shot = RunCommand("timeout 60 " + chromium + "--window-size=1400,400 --screenshot=" + png +
                         " file://" + html);
  EXPECT_EQ(shot.code, 0) << shot.out;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);  // a real picture, not a blank page
  std::ifstream in(html);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("src=\"http"), std::string::npos);  // self-contained: nothing fetched
}

// The README promises the viewer for big exports: a million slices over 64 ranks load and draw
// (spreading a million values into Math.min overflowed the stack and left the page blank).
TEST(TimelineViewerTest, AMillionSlicesLoadInHeadlessChromium) {
  if (RunCommand("command -v chromium").code != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  TempDir dir;
  constexpr int kRanks = 64, kPerRank = 1000000 / kRanks + 1;
  std::string json = "{\"otherData\":{\"title\":\"a million\"},\"traceEvents\":[\n";
  json.reserve(size_t{130} << 20);
  int64_t n = 0;
  for (int r = 0; r < kRanks; ++r) {
    json += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(r / 8) +
            ",\"tid\":0,\"args\":{\"name\":\"node" + std::to_string(r / 8) + "\"}},\n";
    json += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(r / 8) +
            ",\"tid\":" + std::to_string(r) + ",\"args\":{\"name\":\"rank " + std::to_string(r) +
            "\",\"dp\":0,\"pp\":0,\"tp\":0}},\n";
    for (int k = 0; k < kPerRank && n < 1000000; ++k, ++n) {
      json += "{\"ph\":\"X\",\"name\":\"forward\",\"cat\":\"forward\",\"ts\":" +
              std::to_string(k * 10) + ".000,\"dur\":8.000,\"pid\":" + std::to_string(r / 8) +
              ",\"tid\":" + std::to_string(r) + ",\"args\":{\"step\":" + std::to_string(k / 100) +
              "}},\n";
    }
  }
  json += "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":0,\"tid\":0,\"args\":{}}]}";
  TimelineOptions o;
  o.title = "a million";
  const std::string html = dir.path() + "/big.html";
  {
    std::ofstream f(html);
    f << TimelineHtml(json, o);
  }
  const std::string chromium =
      "chromium --headless --no-sandbox --disable-gpu --disable-background-networking "
      "--disable-component-update --no-first-run --disable-sync --user-data-dir=" +
      dir.path() + "/chrome ";
  auto dom = RunCommand("timeout 170 " + chromium +
                        "--virtual-time-budget=60000 --dump-dom file://" + html + " 2>/dev/null");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 500);
  EXPECT_EQ(dom.out.find("data-error"), std::string::npos)
      << dom.out.substr(0, dom.out.find("<header"));
  EXPECT_NE(dom.out.find("data-spans=\"1000000\""), std::string::npos)
      << dom.out.substr(0, dom.out.find("<header"));
  EXPECT_NE(dom.out.find("data-ranks=\"64\""), std::string::npos);
}

TEST_F(TimelineTest, BadArgumentsAreRefused) {
  EXPECT_EQ(RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() +
                       "/run --steps 5:2 -o x.json")
                .code,
            2);
  EXPECT_EQ(RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() +
                       "/run --steps a:b -o x.json")
                .code,
            2);
  EXPECT_EQ(RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() + "/run").code, 2);
  auto missing =
      RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() + "/none -o x.json");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace megascope::analyzer
