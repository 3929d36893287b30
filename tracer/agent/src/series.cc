#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent_impl.h"

namespace megascope::tracer::agent {

void Agent::Impl::BuildFamilies() {
  namespace m = metrics;
  auto& r = *registry;
  auto gauge = [&](const m::Def& d) { return &Family(prometheus::BuildGauge(), d, r); };
  auto counter = [&](const m::Def& d) { return &Family(prometheus::BuildCounter(), d, r); };
  auto histogram = [&](const m::Def& d) { return &Family(prometheus::BuildHistogram(), d, r); };
  f_step = gauge(m::kStep);
  f_step_seconds = gauge(m::kStepSeconds);
  f_step_compute = gauge(m::kStepCompute);
  f_step_comm = gauge(m::kStepCommWait);
  f_tokens = gauge(m::kTokensPerSecond);
  f_hb_age = gauge(m::kHeartbeatAge);
  f_step_duration = histogram(m::kStepDuration);
  f_coll = histogram(m::kCollectiveDuration);
  f_compute = counter(m::kCompute);
  f_comm = counter(m::kCommWait);
  f_records = counter(m::kTraceRecords);
  f_dropped = counter(m::kTraceDropped);
  f_cpu = gauge(m::kNodeCpu);
  f_mem = gauge(m::kNodeMemory);
  f_net_rx = counter(m::kNodeNetRx);
  f_net_tx = counter(m::kNodeNetTx);
  f_net_rx_err = counter(m::kNodeNetRxErrors);
  f_net_tx_err = counter(m::kNodeNetTxErrors);
  f_disk_r = counter(m::kNodeDiskRead);
  f_disk_w = counter(m::kNodeDiskWritten);
  f_gpu_util = gauge(m::kGpuUtil);
  f_gpu_power = gauge(m::kGpuPower);
  f_gpu_temp = gauge(m::kGpuTemp);
  f_gpu_mem = gauge(m::kGpuMemory);
  f_rows = counter(m::kAgentRows);
  f_db_errors = counter(m::kAgentDbErrors);
  f_rows->Add(NodeLabels());  // node series exist from the start, at zero
  f_db_errors->Add(NodeLabels());
}

std::map<std::string, std::string> Agent::Impl::Labels(const RankInfo& i) const {
  return {{"job", opt.job},
          {"node", opt.node},
          {"rank", std::to_string(i.rank)},
          {"dp", std::to_string(i.coords.dp)},
          {"pp", std::to_string(i.coords.pp)},
          {"tp", std::to_string(i.coords.tp)}};
}

std::map<std::string, std::string> Agent::Impl::NodeLabels() const {
  return {{"job", opt.job}, {"node", opt.node}};
}

void Agent::Impl::RetireSeries(RankState& st) {
  if (st.step == nullptr) return;
  std::set<const void*> in_use;
  for (const auto& [name, other] : ranks) {
    if (&other == &st || other.step == nullptr) continue;
    in_use.insert({other.step, other.step_seconds, other.step_compute, other.step_comm,
                   other.tokens, other.hb_age, other.step_duration});
    for (const auto& [key, h] : other.coll) in_use.insert(h);
  }
  auto remove = [&](auto* family, auto* metric) {
    if (!in_use.count(metric)) family->Remove(metric);
  };
  remove(f_step, st.step);
  remove(f_step_seconds, st.step_seconds);
  remove(f_step_compute, st.step_compute);
  remove(f_step_comm, st.step_comm);
  remove(f_tokens, st.tokens);
  remove(f_hb_age, st.hb_age);
  remove(f_step_duration, st.step_duration);
  std::set<Histogram*> colls;  // groups of one kind share a series: remove it once
  for (auto& [key, h] : st.coll) colls.insert(h);
  for (Histogram* h : colls) remove(f_coll, h);
  st.coll.clear();
  st.step = st.step_seconds = st.step_compute = st.step_comm = st.tokens = st.hb_age = nullptr;
  st.step_duration = nullptr;
}

void Agent::Impl::SampleHost(int64_t now_ns, std::vector<MetricRow>* out) {
  auto h = host.Sample();
  if (!h.ok()) {
    Log(opt.node, h.status().message());
    return;
  }
  const auto nl = NodeLabels();
  f_cpu->Add(nl).Set(h->cpu_utilization);
  f_mem->Add(nl).Set(h->memory_used_bytes);
  auto bump = [&](prometheus::Family<Counter>* f, double now, double before) {
    if (now > before && have_last_host)
      f->Add(nl).Increment(now - before);
    else
      f->Add(nl);
  };
  bump(f_net_rx, h->network_receive_bytes, last_host.network_receive_bytes);
  bump(f_net_tx, h->network_transmit_bytes, last_host.network_transmit_bytes);
  bump(f_net_rx_err, h->network_receive_errors, last_host.network_receive_errors);
  bump(f_net_tx_err, h->network_transmit_errors, last_host.network_transmit_errors);
  bump(f_disk_r, h->disk_read_bytes, last_host.disk_read_bytes);
  bump(f_disk_w, h->disk_write_bytes, last_host.disk_write_bytes);
  last_host = *h;
  have_last_host = true;
  namespace m = metrics;
  for (auto [def, v] : {std::pair<const m::Def*, double>{&m::kNodeCpu, h->cpu_utilization},
                        {&m::kNodeMemory, h->memory_used_bytes},
                        {&m::kNodeNetRx, h->network_receive_bytes},
                        {&m::kNodeNetTx, h->network_transmit_bytes},
                        {&m::kNodeNetRxErrors, h->network_receive_errors},
                        {&m::kNodeNetTxErrors, h->network_transmit_errors},
                        {&m::kNodeDiskRead, h->disk_read_bytes},
                        {&m::kNodeDiskWritten, h->disk_write_bytes}}) {
    out->push_back({opt.node, now_ns, std::string(def->name), v});
  }
  for (const GpuSample& g : nvml->Sample()) {
    auto gl = nl;
    gl["gpu"] = std::to_string(g.index);
    f_gpu_util->Add(gl).Set(g.utilization);
    f_gpu_power->Add(gl).Set(g.power_watts);
    f_gpu_temp->Add(gl).Set(g.temperature_celsius);
    f_gpu_mem->Add(gl).Set(g.memory_used_bytes);
    const std::string p = "gpu" + std::to_string(g.index) + ".";
    out->push_back({opt.node, now_ns, p + std::string(metrics::kGpuUtil.name), g.utilization});
    out->push_back({opt.node, now_ns, p + std::string(metrics::kGpuPower.name), g.power_watts});
    out->push_back(
        {opt.node, now_ns, p + std::string(metrics::kGpuTemp.name), g.temperature_celsius});
    out->push_back(
        {opt.node, now_ns, p + std::string(metrics::kGpuMemory.name), g.memory_used_bytes});
  }
}

}  // namespace megascope::tracer::agent
