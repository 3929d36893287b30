// Timeline export on a real run: valid Chrome trace-event JSON, and the HTML viewer rendered by
// headless Chromium with one row per rank and no script errors (a screenshot is kept).
#include "megascope/analyzer/timeline.h"

#include <gtest/gtest.h>

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

TEST_F(TimelineTest, JsonFollowsTheTraceEventFormat) {
  const std::string out = dir_->path() + "/t.json";
  auto r = RunCommand(std::string(MEGASCOPE_BIN) + " timeline " + dir_->path() +
                      "/run --steps 1:2 -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out);
  auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j["traceEvents"].is_array());
  std::map<std::string, int> threads;  // "pid/tid" -> sort index
  std::set<int64_t> starts, finishes;
  std::set<int64_t> steps;
  int spans = 0;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
    const std::string ph = e["ph"];
    if (ph == "X") {
      ++spans;
      for (const char* k : {"name", "ts", "dur", "cat", "args"}) EXPECT_TRUE(e.contains(k)) << k;
      EXPECT_GE(e["dur"].get<double>(), 0);
      steps.insert(e["args"]["step"].get<int64_t>());
    } else if (ph == "M" && e["name"] == "thread_name") {
      EXPECT_TRUE(std::regex_match(e["args"]["name"].get<std::string>(),
                                   std::regex(R"(rank \d+ \(dp=\d+, pp=\d+, tp=\d+\))")));
      threads[std::to_string(e["pid"].get<int>()) + "/" + std::to_string(e["tid"].get<int>())] = 0;
    } else if (ph == "s") {
      starts.insert(e["id"].get<int64_t>());
    } else if (ph == "f") {
      finishes.insert(e["id"].get<int64_t>());
      EXPECT_EQ(e["bp"], "e");
    }
  }
  EXPECT_EQ(threads.size(), 8u);  // one thread per rank
  EXPECT_GT(spans, 0);
  EXPECT_EQ(steps, (std::set<int64_t>{1, 2}));
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
  EXPECT_NE(dom.out.find("data-rows=\"8\""), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_EQ(dom.out.find("data-error"), std::string::npos) << "the viewer raised a script error";
  auto shot = RunCommand("timeout 60 " + chromium + "--window-size=1400,400 --screenshot=" + png +
                         " file://" + html);
  EXPECT_EQ(shot.code, 0) << shot.out;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);  // a real picture, not a blank page
  std::ifstream in(html);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("src=\"http"), std::string::npos);  // self-contained: nothing fetched
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
