#include "megascope/controller/inject.h"

#include <array>
#include <optional>
#include <sstream>
#include <string>

#include "megascope/tracer/enum_names.h"

namespace megascope::controller {
namespace {

// In enum order (inject.h).
constexpr std::array<std::string_view, 10> kKindNames = {
    "crash",   "hang",   "freeze", "stall-send", "slow", "kill-agent", "corrupt-checkpoint",
    "degrade", "metric", "link"};
constexpr std::array<std::string_view, 3> kLinkKindNames = {"slow", "loss", "down"};

// "a, b, c": a table's spellings, for an error that lists them.
template <size_t N>
std::string Listed(const std::array<std::string_view, N>& names) {
  std::string out;
  for (const std::string_view n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

std::string_view Name(LinkFaultKind kind) { return tracer::NameFrom(kLinkKindNames, kind); }

std::string_view Name(FaultKind kind) { return tracer::NameFrom(kKindNames, kind); }

std::optional<launch::WorkerFaultKind> WorkerFaultOf(FaultKind k) {
  switch (k) {
    case FaultKind::kCrash:
      return launch::WorkerFaultKind::kCrash;
    case FaultKind::kHang:
      return launch::WorkerFaultKind::kHang;
    case FaultKind::kFreeze:
      return launch::WorkerFaultKind::kFreeze;
    case FaultKind::kStallSend:
      return launch::WorkerFaultKind::kStallSend;
    case FaultKind::kSlow:
      return launch::WorkerFaultKind::kSlow;
    default:
      return std::nullopt;
  }
}

bool IsWorkerFault(FaultKind k) { return WorkerFaultOf(k).has_value(); }

namespace {

// One key=value of an injection into `in` (`bare`: a key without '='); `link_fields` is set by
// the link fault's own fields.
Status ReadField(const std::string& spec, const std::string& key, const std::string& value,
                 bool bare, Injection& in, bool& link_fields) {
  try {
    size_t used = 0;
    if (key == "node") {
      in.node = value;
      used = value.size();
    } else if (key == "rank") {
      in.rank = std::stoi(value, &used);
    } else if (key == "pp") {
      in.pp = std::stoi(value, &used);
    } else if (key == "what") {
      if (value != "nic-errors" && value != "memory")
        return InvalidArgument("--inject '" + spec + "': what='" + value +
                               "' is not a metric fault (nic-errors, memory)");
      in.what = value;
      used = value.size();
    } else if (key == "kind") {
      const std::optional<LinkFaultKind> link =
          tracer::ParseFrom<LinkFaultKind>(kLinkKindNames, value);
      if (!link)
        return InvalidArgument("--inject '" + spec + "': kind='" + value +
                               "' is not a link fault (" + Listed(kLinkKindNames) + ")");
      in.link = *link;
      link_fields = true;
      used = value.size();
    } else if (key == "rate") {
      in.rate_mbps = std::stod(value, &used);
      link_fields = true;
    } else if (key == "loss") {
      in.loss_pct = std::stod(value, &used);
      link_fields = true;
    } else if (key == "at") {
      if (!value.empty() && value.back() == 's') {
        in.at_seconds = std::stod(value.substr(0, value.size() - 1), &used);
        ++used;
      } else {
        in.at_step = std::stoll(value, &used);
      }
    } else if (key == "seconds") {
      in.seconds = std::stod(value, &used);
    } else if (key == "factor") {
      in.factor = std::stod(value, &used);
    } else if (key == "persist" && bare) {
      in.persist = true;
    } else {
      return InvalidArgument(
          "--inject '" + spec + "': unknown field '" + key +
          "' (node, rank, pp, at, seconds, factor, what, kind, rate, loss, persist)");
    }
    if (used != value.size()) throw std::invalid_argument(value);
  } catch (const std::exception&) {
    return InvalidArgument("--inject '" + spec + "': '" + value + "' is not a number");
  }
  return Status::Ok();
}

// A link fault's fields checked, its defaults filled in.
Status CheckLinkFault(const std::string& spec, Injection& in) {
  if (in.node.empty()) return InvalidArgument("--inject '" + spec + "' needs node=N");
  if (!in.what.empty())
    return InvalidArgument("--inject '" + spec + "': what= belongs to metric faults");
  if (in.rate_mbps != 0 && in.link != LinkFaultKind::kSlow)
    return InvalidArgument("--inject '" + spec + "': rate= belongs to kind=slow");
  if (in.loss_pct != 0 && in.link != LinkFaultKind::kLoss)
    return InvalidArgument("--inject '" + spec + "': loss= belongs to kind=loss");
  if (in.link == LinkFaultKind::kSlow && in.rate_mbps == 0) in.rate_mbps = 10;
  if (in.link == LinkFaultKind::kLoss && in.loss_pct == 0) in.loss_pct = 30;
  if (in.rate_mbps < 0) return InvalidArgument("--inject '" + spec + "': rate must be > 0 MB/s");
  if (in.loss_pct < 0 || in.loss_pct > 100)
    return InvalidArgument("--inject '" + spec + "': loss must be a percentage in (0, 100]");
  if (in.at_step < 0 && in.at_seconds < 0)
    return InvalidArgument("--inject '" + spec + "' needs at=STEP or at=SECONDSs");
  return Status::Ok();
}

// What each kind needs given, and may not be given, checked; defaults filled in.
Status CheckInjection(const std::string& spec, bool link_fields, Injection& in) {
  const bool targeted =
      !in.node.empty() || in.rank >= 0 || (in.kind == FaultKind::kSlow && in.pp >= 0);
  if (link_fields && in.kind != FaultKind::kLink)
    return InvalidArgument("--inject '" + spec + "': kind=, rate= and loss= belong to link faults");
  if (in.pp >= 0 && in.kind != FaultKind::kSlow)
    return InvalidArgument("--inject '" + spec + "': pp=S targets only slow");
  if (in.persist && (!IsWorkerFault(in.kind) || in.node.empty())) {
    return InvalidArgument("--inject '" + spec +
                           "': persist (the node stays broken until evicted) needs a fault of a " +
                           "rank (crash, hang, freeze, stall-send, slow) aimed at node=N");
  }
  const bool timed = in.at_step >= 0 || in.at_seconds >= 0;
  if (IsWorkerFault(in.kind)) {
    if (!targeted)
      return InvalidArgument("--inject '" + spec + "' needs node=N or rank=R" +
                             (in.kind == FaultKind::kSlow ? " or pp=S" : ""));
    if (in.at_step < 0) return InvalidArgument("--inject '" + spec + "' needs at=STEP");
    if (in.kind == FaultKind::kSlow && in.seconds <= 0 && in.factor <= 1)
      return InvalidArgument("--inject '" + spec + "' needs seconds=X > 0 or factor=F > 1");
  } else if (in.kind == FaultKind::kKillAgent) {
    if (in.node.empty()) return InvalidArgument("--inject '" + spec + "' needs node=N");
    if (!timed) return InvalidArgument("--inject '" + spec + "' needs at=STEP or at=SECONDSs");
  } else if (in.kind == FaultKind::kDegrade) {
    if (in.node.empty()) return InvalidArgument("--inject '" + spec + "' needs node=N");
    if (in.factor == 0) in.factor = 3;
    if (in.factor < 1) return InvalidArgument("--inject '" + spec + "': factor must be >= 1");
  } else if (in.kind == FaultKind::kLink) {
    return CheckLinkFault(spec, in);
  } else if (in.kind == FaultKind::kMetric) {
    if (in.node.empty()) return InvalidArgument("--inject '" + spec + "' needs node=N");
    if (in.what.empty())
      return InvalidArgument("--inject '" + spec + "' needs what=nic-errors or what=memory");
    if (!timed) return InvalidArgument("--inject '" + spec + "' needs at=STEP or at=SECONDSs");
  }
  return Status::Ok();
}

}  // namespace

Result<Injection> ParseInjection(const std::string& spec) {
  Injection in;
  bool link_fields = false;  // kind=, rate= or loss= given
  in.spec = spec;
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::optional<FaultKind> known = tracer::ParseFrom<FaultKind>(kKindNames, kind);
  if (!known)
    return InvalidArgument("--inject '" + spec + "': unknown kind '" + kind + "' (one of " +
                           Listed(kKindNames) + ")");
  in.kind = *known;
  std::stringstream ss(colon == std::string::npos ? "" : spec.substr(colon + 1));
  for (std::string kv; std::getline(ss, kv, ',');) {
    const auto eq = kv.find('=');
    const std::string key = kv.substr(0, eq),
                      value = eq == std::string::npos ? "" : kv.substr(eq + 1);
    RETURN_IF_ERROR(ReadField(spec, key, value, eq == std::string::npos, in, link_fields));
  }
  RETURN_IF_ERROR(CheckInjection(spec, link_fields, in));
  return in;
}

Injection* FiredInjection(std::vector<Injection>& injections, launch::WorkerFaultKind kind,
                          int rank, int64_t step) {
  Injection* best = nullptr;
  for (Injection& in : injections) {
    if (in.fired || WorkerFaultOf(in.kind) != kind || in.planned_rank != rank || in.at_step > step)
      continue;
    if (best == nullptr || in.at_step > best->at_step) best = &in;
  }
  return best;
}

}  // namespace megascope::controller
