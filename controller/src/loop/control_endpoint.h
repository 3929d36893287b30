// The controller's control endpoint (impl.h's ControlHandler): `megascope evict` and `megascope
// stop` reach the loop through it.
#pragma once

#include <CivetServer.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "impl.h"
#include "megascope/tracer/http_serve.h"

namespace megascope::controller {

// The control endpoint: POST /stop and POST /evict?node=N with "Authorization: Bearer <token>".
class ControlHandler : public CivetHandler {
 public:
  // `nodes`: the job's nodes as the controller last saw them, guarded by `mu` like `queue`.
  ControlHandler(std::string token, std::mutex* mu, std::deque<Command>* queue,
                 const std::vector<std::string>* nodes)
      : token_(std::move(token)), mu_(mu), queue_(queue), nodes_(nodes) {}
  bool handlePost(CivetServer*, mg_connection* conn) override {
    const mg_request_info* ri = mg_get_request_info(conn);
    if (token_.empty() || !tracer::HttpAuthorized(conn, token_)) {
      Reply(conn, 403, "missing or wrong token (read it from RUN_DIR/control.token)");
      return true;
    }
    const std::string uri = ri->local_uri ? ri->local_uri : "";
    Command c;
    if (uri == "/stop") {
      c.what = "stop";
    } else if (uri == "/evict") {
      char node[256] = {};
      if (ri->query_string == nullptr || mg_get_var(ri->query_string, std::strlen(ri->query_string),
                                                    "node", node, sizeof(node)) <= 0) {
        Reply(conn, 400, "evict needs ?node=NAME");
        return true;
      }
      c = {"evict", node};
    } else {
      Reply(conn, 404, "use POST /stop or POST /evict?node=NAME");
      return true;
    }
    {
      std::lock_guard<std::mutex> lock(*mu_);
      if (!c.node.empty() && std::find(nodes_->begin(), nodes_->end(), c.node) == nodes_->end()) {
        std::string list;
        for (const std::string& n : *nodes_) list += (list.empty() ? "" : ", ") + n;
        Reply(conn, 404, "no node " + c.node + " in the job (its nodes: " + list + ")");
        return true;
      }
      queue_->push_back(c);
    }
    Reply(conn, 200, "accepted: " + c.what + (c.node.empty() ? "" : " " + c.node));
    return true;
  }

 private:
  static void Reply(mg_connection* conn, int code, const std::string& body) {
    tracer::HttpReply(conn, code, "text/plain", body + "\n");
  }
  std::string token_;
  std::mutex* mu_;
  std::deque<Command>* queue_;
  const std::vector<std::string>* nodes_;
};

}  // namespace megascope::controller
