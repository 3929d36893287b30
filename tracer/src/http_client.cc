#include "megascope/tracer/http_client.h"

#include <curl/curl.h>

#include <cctype>
#include <charconv>
#include <memory>

namespace megascope::tracer {
namespace {

// Where the body goes: into `body`, or, once the status is 200, to `sink` as it arrives.
struct Receiver {
  CURL* curl = nullptr;
  std::string body;
  const BodySink* sink = nullptr;
  Status sink_error;
};

size_t Receive(char* data, size_t size, size_t n, void* out) {
  auto* r = static_cast<Receiver*>(out);
  long code = 0;
  if (r->sink != nullptr && *r->sink) {
    curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code == 200) {
      r->sink_error = (*r->sink)(std::string_view(data, size * n));
      return r->sink_error.ok() ? size * n : 0;  // 0 stops the transfer
    }
  }
  r->body.append(data, size * n);
  return size * n;
}

// curl_global_init once, before any handle (a function-local static is initialised once, safely).
void InitCurl() {
  static const bool done = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  (void)done;
}

using Handle = std::unique_ptr<CURL, decltype(&curl_easy_cleanup)>;

// Each thread keeps one easy handle for its requests (the controller's pollers ask many agents one
// after another): a new handle per request set up libcurl's private state, caches and wake-up
// sockets every time, most of a request's CPU. A handle is lent out while a request runs; a
// request made inside another's sink gets one of its own.
class LentHandle {
 public:
  LentHandle() {
    thread_local Handle kept(nullptr, &curl_easy_cleanup);
    thread_local bool lent = false;
    if (!lent) {
      if (!kept) kept.reset(curl_easy_init());
      lent_ = &lent;
      handle_ = kept.get();
      lent = handle_ != nullptr;
    } else {
      own_.reset(curl_easy_init());
      handle_ = own_.get();
    }
  }
  ~LentHandle() {
    // Its options pointed at the request's buffers: cleared before the handle waits for the next.
    if (handle_ != nullptr) curl_easy_reset(handle_);
    if (lent_ != nullptr) *lent_ = false;
  }
  LentHandle(const LentHandle&) = delete;
  LentHandle& operator=(const LentHandle&) = delete;
  CURL* Get() const { return handle_; }

 private:
  Handle own_{nullptr, &curl_easy_cleanup};
  CURL* handle_ = nullptr;
  bool* lent_ = nullptr;
};

}  // namespace

namespace {

// One request; `post_body` (with POST) is sent as the request's body.
Result<std::string> Perform(const std::string& method, const std::string& url,
                            const std::vector<std::string>& headers, int timeout_ms,
                            const BodySink& sink, std::string_view post_body) {
  if (url.rfind("http://", 0) != 0)
    return InvalidArgument("only http:// URLs are supported: " + url);
  InitCurl();
  const LentHandle h;
  if (h.Get() == nullptr) return Internal("cannot start libcurl");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> list(nullptr, &curl_slist_free_all);
  for (const std::string& line : headers)
    list.reset(curl_slist_append(list.release(), line.c_str()));
  char error[CURL_ERROR_SIZE] = "";
  CURL* c = h.Get();
  Receiver received{c, {}, &sink, Status::Ok()};
  std::string& body = received.body;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // called from many threads
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Receive);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &received);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  if (list) curl_easy_setopt(c, CURLOPT_HTTPHEADER, list.get());
  // A stream (a node's dumps are megabytes) is handed on in 512-KB reads, not libcurl's 16 KB.
  if (sink) curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10);
  if (method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, post_body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(post_body.size()));
  } else if (method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  const CURLcode rc = curl_easy_perform(c);
  if (!received.sink_error.ok()) return received.sink_error;
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return Status(StatusCode::kDeadlineExceeded,
                  url + " did not answer within " + std::to_string(timeout_ms) + " ms");
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
    return Status(StatusCode::kUnavailable,
                  "cannot connect to " + url + " (is it running?): " + error);
  if (rc != CURLE_OK)
    return Status(StatusCode::kUnavailable, url + ": " + (*error ? error : curl_easy_strerror(rc)));
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  if (code == 200) return body;
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
  const std::string msg =
      url + " answered HTTP " + std::to_string(code) + (body.empty() ? "" : ": " + body);
  if (code == 403) return PermissionDenied(msg);
  if (code == 404) return NotFound(msg);
  return Status(StatusCode::kUnavailable, msg);
}

}  // namespace

Result<std::string> HttpRequest(const std::string& method, const std::string& url,
                                const std::vector<std::string>& headers, int timeout_ms,
                                const BodySink& sink) {
  return Perform(method, url, headers, timeout_ms, sink, "");
}

Result<std::string> HttpPost(const std::string& url, std::string_view body,
                             const std::vector<std::string>& headers, int timeout_ms) {
  return Perform("POST", url, headers, timeout_ms, nullptr, body);
}

std::string PercentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3 / 2);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == '~') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int v = 0;
    if (s[i] == '%' && i + 2 < s.size()) {
      const auto [end, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
      if (ec == std::errc() && end == s.data() + i + 3) {
        out += static_cast<char>(v);
        i += 2;
        continue;
      }
    }
    out += plus_is_space && s[i] == '+' ? ' ' : s[i];
  }
  return out;
}

Result<std::string> HttpGet(const std::string& url, int timeout_ms, const std::string& token) {
  if (token.empty()) return HttpRequest("GET", url, {}, timeout_ms);
  return HttpRequest("GET", url, {"Authorization: Bearer " + token}, timeout_ms);
}

Status HttpGetStream(const std::string& url, int timeout_ms, const std::string& token,
                     const BodySink& sink) {
  std::vector<std::string> headers;
  if (!token.empty()) headers.push_back("Authorization: Bearer " + token);
  return HttpRequest("GET", url, headers, timeout_ms, sink).status();
}

}  // namespace megascope::tracer
