// The controller's loop over a scripted fleet and a fake clock (fake_fleet.h): what the loop tests
// share: a job of 4 ranks on node0 and node1 with spares, run to its end, its control.db read
// back.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fake_fleet.h"
#include "http_fleet.h"
#include "megascope/controller/control_db.h"
#include "megascope/controller/controller.h"
#include "test_util.h"

namespace megascope::controller {

namespace fs = std::filesystem;
using testing::FakeClock;
using testing::FakeFault;
using testing::FakeFleet;

class LoopTest : public ::testing::Test {
 protected:
  // A job of `steps` steps, 4 ranks on node0 and node1, with `spares`.
  void SetUp() override { options_ = Options(20, {"spare0"}); }

  ControllerOptions Options(int64_t steps, std::vector<std::string> spares) {
    ControllerOptions o;
    o.supervisor.run_dir = dir_.path() + "/run";
    o.supervisor.shm_dir = dir_.path() + "/shm";
    o.supervisor.job = "loop";
    o.world = 4;
    o.nodes = {"node0", "node1"};
    o.spares = std::move(spares);
    o.steps = steps;
    o.tick_s = 0.25;
    o.hang_after_s = 3;
    o.startup_grace_s = 10;
    o.detector_tick_s = 0;  // no agent here serves metrics (ServeMetrics for the detector)
    o.straggler_every = 0;  // nor trace databases (TraceSteps for the straggler watch)
    o.min_free_bytes = 0;
    return o;
  }

  // Runs the controller over `fleet` (made by Fleet()) to its end; its exit code.
  int Run() {
    std::unique_ptr<controller::Fleet> fleet;
    if (over_http_)
      fleet = std::make_unique<testing::HttpFleet>(std::move(owned_));
    else
      fleet = std::move(owned_);
    controller_ = std::make_unique<Controller>(options_, std::move(fleet), &clock_);
    return controller_->Run();
  }
  // Another launch in the same run directory, later, over a fleet of its own (fleet_ then), once
  // the first one's process is gone; its exit code.
  int Relaunch() {
    controller_.reset();
    relaunch_clock_ = std::make_unique<FakeClock>(clock_.WallNs() + 1'000'000'000);
    owned_ = std::make_unique<FakeFleet>(options_.supervisor.run_dir, relaunch_clock_.get(),
                                         options_.steps);
    fleet_ = owned_.get();
    controller_ = std::make_unique<Controller>(options_, std::move(owned_), relaunch_clock_.get());
    return controller_->Run();
  }
  // node0's send to node1 stops moving once the job has done 6 steps (both ends posted).
  void StallLinkAtStep6() {
    FakeFault stall{FakeFault::kStallLink, "node0", 6};
    stall.peer = "node1";
    Fleet().Break(stall);
  }
  // A job of `steps` steps watched for stragglers every 4 steps (2 windows in a row to act), its
  // steps traced; `node` computes 2.5 times longer from step 4 on.
  void SlowFromStep4(int64_t steps, const std::string& node, int stages = 1) {
    options_ = Options(steps, {"spare0"});
    options_.straggler_every = 4;
    options_.policy.straggler_windows = 2;
    FakeFault slow{FakeFault::kSlow, node, 4};
    slow.factor = 2.5;
    Fleet().Break(slow);
    fleet_->TraceSteps(0.1, stages);
  }
  // From step 4 on (after the launch's healthy figures), `node`'s self-checks measure an
  // all-reduce at 5 % of the healthy figure and a healthy GEMM.
  // From step 4 the node's self-checks measure a slow all-reduce and a GEMM that holds; with
  // `under_floor`, as a real check under the controller's bandwidth floor does, the check ends at
  // once with no all-reduce figure (`self-check --min-gbps`), its GEMM's figure said first.
  void SlowLinkOnItsChecks(const std::string& node, bool under_floor = false) {
    clock_.OnSleep([this, node, under_floor] {
      if (fleet_->done() != 4) return;
      SelfCheckFigures slow_link;
      slow_link.ok = !under_floor;
      slow_link.gemm_gflops = 100;
      slow_link.allreduce_gbps = under_floor ? 0 : 0.05;  // the healthy figure is 1
      if (under_floor)
        slow_link.error =
            "self-check exited with code 1: the all-reduces with its neighbour "
            "moved under half of the 0.300 GB/s floor";
      fleet_->SetSelfCheck(node, slow_link);
    });
  }
  // node1's network is slow from step 4: it reaches every all-reduce 0.2 s late.
  void SlowNetworkOfNode1(bool under_floor) {
    options_ = Options(24, {"spare0"});
    options_.straggler_every = 4;
    options_.policy.straggler_windows = 2;
    FakeFault late{FakeFault::kSlowNet, "node1", 4};
    late.late_s = 0.2;
    Fleet().Break(late);
    fleet_->TraceSteps(0.1, 1, /*collectives=*/true);
    SlowLinkOnItsChecks("node1", under_floor);
  }
  // Three nodes of one rank each and two spares: node1's rank crashes and node2's hangs in compute
  // once the job has done `step` steps. The launch's exit code.
  int CrashOnNode1AndHangOnNode2At(int64_t step) {
    options_.nodes = {"node0", "node1", "node2"};
    options_.world = 3;
    options_.spares = {"spare0", "spare1"};
    Fleet().Break({FakeFault::kCrash, "node1", step});
    fleet_->Break({FakeFault::kHang, "node2", step});
    return Run();
  }
  FakeFleet& Fleet() {
    if (!owned_) {
      owned_ = std::make_unique<FakeFleet>(options_.supervisor.run_dir, &clock_, options_.steps);
      fleet_ = owned_.get();
    }
    return *fleet_;
  }

  std::vector<Event> Events(const std::string& kind = "") const {
    auto db = ControlDb::Open(options_.supervisor.run_dir + "/control.db", true);
    EXPECT_TRUE(db.ok()) << db.status().ToString();
    if (!db.ok()) return {};
    auto all = (*db)->Events();
    std::vector<Event> out;
    for (const Event& e : all.value_or(std::vector<Event>{})) {
      if (kind.empty() || e.kind_name == kind) out.push_back(e);
    }
    return out;
  }
  static std::vector<std::string> Nodes(const std::vector<Event>& events) {
    std::vector<std::string> out;
    out.reserve(events.size());
    for (const Event& e : events) out.push_back(e.node);
    return out;
  }

  megascope::testing::TempDir dir_;
  FakeClock clock_;
  ControllerOptions options_;
  std::unique_ptr<FakeFleet> owned_;
  bool over_http_ = false;      // Run asks the fleet's agents over real HTTP (http_fleet.h)
  FakeFleet* fleet_ = nullptr;  // owned by the controller once it runs
  std::unique_ptr<FakeClock> relaunch_clock_;  // outlives the controller that reads it
  std::unique_ptr<Controller> controller_;
};

}  // namespace megascope::controller
