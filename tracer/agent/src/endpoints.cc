#include <prometheus/text_serializer.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "agent_impl.h"
#include "megascope/tracer/http_serve.h"
#include "megascope/tracer/run_layout.h"
#include "megascope/tracer/sqlite.h"

namespace megascope::tracer::agent {
namespace {

// Every endpoint: the token checked (403 without it), then the answer.
class Handler : public CivetHandler {
 public:
  explicit Handler(std::string token) : token_(std::move(token)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* info = mg_get_request_info(conn);
    if (!HttpAuthorized(conn, token_)) {
      Reply(conn, 403, "text/plain", "missing or wrong token (the run's RUN_DIR/control.token)\n");
      return true;
    }
    Serve(conn, info->local_uri ? info->local_uri : "",
          info->query_string ? info->query_string : "");
    return true;
  }

 protected:
  virtual void Serve(mg_connection* conn, const std::string& uri, const std::string& query) = 0;
  static void Reply(mg_connection* conn, int code, const char* type, const std::string& body) {
    HttpReply(conn, code, type, body);
  }

 private:
  std::string token_;  // "": open
};

// An answer computed whole: (code, body) from the URI.
class TextHandler : public Handler {
 public:
  using Fn = std::function<std::pair<int, std::string>(const std::string& uri)>;
  TextHandler(Fn fn, const char* type, const std::string& token)
      : Handler(token), fn_(std::move(fn)), type_(type) {}

 private:
  void Serve(mg_connection* conn, const std::string& uri, const std::string&) override {
    auto [code, body] = fn_(uri);
    Reply(conn, code, type_, body);
  }
  Fn fn_;
  const char* type_;
};

// An answer computed whole from the URL's query string (GET /window?..., GET /query?...).
class QueryHandler : public Handler {
 public:
  using Fn = std::function<std::pair<int, std::string>(std::string_view query)>;
  QueryHandler(Fn fn, const std::string& token) : Handler(token), fn_(std::move(fn)) {}

 private:
  void Serve(mg_connection* conn, const std::string&, const std::string& query) override {
    auto [code, body] = fn_(query);
    Reply(conn, code, "application/json", body);
  }
  Fn fn_;
};

// GET /dumps[?attempt=A][&form=json|binary], streamed in chunks (HTTP/1.1 chunked transfer): a
// node of 1,000 ranks answers 70 MB of JSON (17 MB binary), written and sent a rank at a time.
class DumpsHandler : public Handler {
 public:
  DumpsHandler(Agent* agent, const std::string& token) : Handler(token), agent_(agent) {}

 private:
  void Serve(mg_connection* conn, const std::string& uri, const std::string& query) override {
    long attempt = -1;
    bool binary = false;
    bool ok = uri == "/dumps";
    for (size_t at = 0; ok && at < query.size();) {  // attempt=<n>, form=json|binary
      size_t end = query.find('&', at);
      if (end == std::string::npos) end = query.size();
      const std::string p = query.substr(at, end - at);
      at = end + 1;
      if (p == "form=binary" || p == "form=json") {
        binary = p == "form=binary";
      } else if (p.starts_with("attempt=") && p.size() > 8) {
        char* tail = nullptr;
        attempt = std::strtol(p.c_str() + 8, &tail, 10);
        ok = *tail == '\0' && attempt >= 0 && attempt <= INT32_MAX;
      } else {
        ok = false;
      }
    }
    if (!ok) {
      Reply(conn, 404, "application/json",
            "{\"error\":\"use /dumps[?attempt=<attempt>][&form=json|binary]\"}\n");
      return;
    }
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"
              "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
              binary ? "application/octet-stream" : "application/x-ndjson");
    agent_->StreamDumps(static_cast<int>(attempt), binary, [conn](std::string_view data) {
      mg_send_chunk(conn, data.data(), static_cast<unsigned>(data.size()));
    });
    mg_send_chunk(conn, "", 0);
  }
  Agent* agent_;
};

// Restarts, evictions and verdicts of the run, read from the controller's control.db
// (docs/formats.md section 4) when one exists: "restart" events by detail.cause (the job's start
// excluded), "eviction" events by detail.reason, "verdict" events by detail.kind and detail.cause.
// Every agent serves the run's counts (with its own node label): aggregate them with max, not sum.
void AppendControlCounters(const AgentOptions& o, std::ostream& out) {
  auto db = sql::Database::Open(RunLayout(o.run_dir).control_db(), sql::Database::Mode::kReadOnly,
                                "[agent]", /*busy_timeout_ms=*/200);
  if (!db.ok()) return;  // no controller: no families
  struct Family {
    std::string name;
    std::string_view help;
    const char* kind;
    std::vector<const char*> fields;  // detail fields, each a label
  };
  for (const Family& f : {Family{metrics::PrometheusName(metrics::kRestarts),
                                 metrics::kRestarts.help,
                                 "restart",
                                 {"cause"}},
                          Family{metrics::PrometheusName(metrics::kEvictions),
                                 metrics::kEvictions.help,
                                 "eviction",
                                 {"reason"}},
                          Family{metrics::PrometheusName(metrics::kVerdicts),
                                 metrics::kVerdicts.help,
                                 "verdict",
                                 {"kind", "cause"}}}) {
    out << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " counter\n";
    std::string cols, groups;
    for (size_t i = 0; i < f.fields.size(); ++i) {
      cols += std::string(i ? ", " : "") + "COALESCE(json_extract(detail_json, '$." + f.fields[i] +
              "'), 'unknown')";
      groups += (i ? ", " : "") + std::to_string(i + 1);
    }
    const std::string sql = "SELECT " + cols +
                            ", COUNT(*) FROM events WHERE kind = ?1 AND "
                            "COALESCE(json_extract(detail_json, '$.cause'), '') != 'start' "
                            "GROUP BY " +
                            groups;
    auto st = db->Prepare(sql);
    if (!st.ok()) continue;
    st->Bind(1, f.kind);
    const int n = static_cast<int>(f.fields.size());
    while (st->Step().value_or(false)) {
      out << f.name << "{job=\"" << o.job << "\",node=\"" << o.node << "\"";
      for (int i = 0; i < n; ++i) {
        std::string label(st->Text(i));
        std::erase_if(label, [](char c) { return c == '"' || c == '\\' || c == '\n'; });
        out << "," << f.fields[static_cast<size_t>(i)] << "=\"" << label << "\"";
      }
      out << "} " << st->Int(n) << "\n";
    }
  }
}

}  // namespace

Status Agent::Impl::Serve(Agent* a) {
  try {
    std::vector<std::string> opts = {"listening_ports", opt.listen, "num_threads", "4"};
    CivetCallbacks callbacks;
    KeepStartErrors(&callbacks);
    http = std::make_unique<CivetServer>(opts, &callbacks);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  "cannot listen on " + opt.listen + ": " + e.what() + StartError());
  }
  handlers.push_back(std::make_unique<TextHandler>(
      [a](const std::string&) { return std::pair<int, std::string>(200, a->MetricsText()); },
      "text/plain; version=0.0.4; charset=utf-8", opt.token));
  http->addHandler("/metrics", handlers.back().get());
  handlers.push_back(std::make_unique<TextHandler>(
      [a](const std::string&) { return std::pair<int, std::string>(200, a->StateJson()); },
      "application/json", opt.token));
  http->addHandler("/state", handlers.back().get());
  // GET /dumps[?attempt=A][&form=binary]: every rank's dump in one answer, one a JSON line (or the
  // binary dump stream, what live hang analysis reads), sent as each is written: one request a
  // node instead of one a rank.
  handlers.push_back(std::make_unique<DumpsHandler>(a, opt.token));
  http->addHandler("/dumps", handlers.back().get());
  // GET <prefix><rank>: one rank's dump, from its ring (/dump/) or asked of it with stacks.
  auto per_rank = [&](const std::string& prefix,
                      const std::function<Result<std::string>(int)>& fn) {
    handlers.push_back(std::make_unique<TextHandler>(
        [prefix, fn](const std::string& uri) {
          const std::string rank = uri.substr(uri.rfind('/') + 1);
          char* end = nullptr;
          const long r = std::strtol(rank.c_str(), &end, 10);
          if (rank.empty() || *end != '\0')
            return std::pair<int, std::string>(404, "{\"error\":\"use " + prefix + "<rank>\"}\n");
          auto d = fn(static_cast<int>(r));
          return d.ok() ? std::pair<int, std::string>(200, *d)
                        : std::pair<int, std::string>(
                              404, "{\"error\":\"" + d.status().message() + "\"}\n");
        },
        "application/json", opt.token));
    http->addHandler(prefix, handlers.back().get());
  };
  if (opt.window) {
    handlers.push_back(std::make_unique<QueryHandler>(opt.window, opt.token));
    http->addHandler("/window", handlers.back().get());
  }
  if (opt.query) {
    handlers.push_back(std::make_unique<QueryHandler>(opt.query, opt.token));
    http->addHandler("/query", handlers.back().get());
  }
  per_rank("/dump/", [a](int r) { return a->DumpJson(r); });
  per_rank("/stacks/", [a](int r) { return a->StacksJson(r); });
  return Status::Ok();
}

std::string Agent::Impl::State() {
  std::lock_guard<std::mutex> lock(mu);
  nlohmann::ordered_json ranks_j = nlohmann::ordered_json::array();
  const int64_t now = clock.WallNs();
  for (const auto& [name, st] : ranks) {
    nlohmann::ordered_json open = nlohmann::ordered_json::array();
    for (const FlightEntry& e : st.snap.entries) {
      if (e.state != OpState::kEnqueued && e.state != OpState::kStarted) continue;
      open.push_back(
          {{"group",
            e.group < static_cast<int>(st.snap.groups.size()) ? st.snap.groups[e.group].name : "?"},
           {"seq", e.seq},
           {"op", Name(e.op)},
           {"peer", e.peer < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.peer)},
           {"bytes", e.bytes},
           {"state", Name(e.state)},
           {"enqueued_at_ns", e.enqueued_at_ns},
           {"bytes_sent", e.bytes_sent < 0 ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json(e.bytes_sent)},
           {"bytes_received", e.bytes_received < 0 ? nlohmann::ordered_json(nullptr)
                                                   : nlohmann::ordered_json(e.bytes_received)}});
    }
    const auto& hb = st.snap.heartbeat;
    ranks_j.push_back(
        {{"rank", st.info.rank},
         {"attempt", st.info.attempt},
         {"node", st.info.node},
         {"pid", st.info.pid},
         {"coords",
          {{"dp", st.info.coords.dp}, {"pp", st.info.coords.pp}, {"tp", st.info.coords.tp}}},
         {"alive", !st.dead},
         {"closed", st.reader->Closed()},
         {"heartbeat",
          {{"step", hb.step},
           {"phase", Name(hb.phase)},
           {"updated_at_ns", hb.updated_at_ns},
           {"age_s", static_cast<double>(now - hb.updated_at_ns) / 1e9}}},
         {"open_entries", open},
         {"records_total", st.snap.records_total},
         {"dropped_records", st.snap.dropped_total}});
  }
  nlohmann::ordered_json j = {{"format", "megascope-agent-state"},
                              {"version", 1},
                              {"job", opt.job},
                              {"node", opt.node},
                              {"now_ns", now},
                              {"rows_written", rows.load()},
                              {"db_errors", db_errors.load()},
                              {"ranks", ranks_j}};
  return j.dump() + "\n";
}

std::string Agent::Impl::MetricsText() {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry->Collect());
  AppendControlCounters(opt, out);
  if (shipper) out << shipper->MetricsText("job=\"" + opt.job + "\",node=\"" + opt.node + "\"");
  return out.str();
}

}  // namespace megascope::tracer::agent
