// A fixture for analyzer tests over small real training runs (`megascope train` of a 2-layer,
// width-32 model for 8 steps), each in its own run directory of one temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "megascope/runtime/data.h"
#include "test_util.h"

namespace megascope::analyzer {

class SmallRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/notes.bin";
    ASSERT_TRUE(
        runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data_).ok());
  }
  std::string Run(const std::string& name, const std::string& extra,
                  const std::string& layout = "--dp 2 --tp 2 --pp 1") {
    std::string run = dir_.path() + "/" + name;
    auto r = megascope::testing::RunCommand(
        std::string(MEGASCOPE_BIN) + " train " + layout + " --data " + data_ + " --run-dir " + run +
        " --job s" + std::to_string(::getpid()) + name +
        " --steps 8 --layers 2 --width 32 --heads 2 --seq 16 --batch 4 " + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    return run;
  }
  megascope::testing::TempDir dir_;
  std::string data_;
};

}  // namespace megascope::analyzer
