#include "megascope/tracer/clickhouse.h"

#include <cctype>
#include <charconv>

#include "megascope/tracer/http_client.h"

namespace megascope::tracer {
namespace {

bool ValidIdentifier(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_') return false;
  return true;
}

// "Code: 60, e.displayText() = DB::Exception: Table x doesn't exist, e.what() = DB::Exception"
// (18.16) or "Code: 60. DB::Exception: Table x does not exist. (UNKNOWN_TABLE) (version ...)"
// (current releases): the message and its code.
std::string ServerMessage(std::string_view body) {
  const size_t ex = body.find("DB::Exception: ");
  if (ex == std::string_view::npos) return std::string(body);
  std::string_view msg = body.substr(ex + 15);
  if (const size_t what = msg.find(", e.what() = "); what != std::string_view::npos)
    msg = msg.substr(0, what);
  if (const size_t version = msg.find(" (version "); version != std::string_view::npos)
    msg = msg.substr(0, version);
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.remove_suffix(1);
  std::string code;
  if (body.starts_with("Code: ")) {
    const size_t end = body.find_first_not_of("0123456789", 6);
    code = std::string(body.substr(6, end - 6));
  }
  return std::string(msg) + (code.empty() ? "" : " (ClickHouse error " + code + ")");
}

void Unescape(std::string_view cell, std::string& out) {
  out.clear();
  for (size_t i = 0; i < cell.size(); ++i) {
    if (cell[i] != '\\' || i + 1 == cell.size()) {
      out += cell[i];
      continue;
    }
    switch (const char c = cell[++i]) {
      case 't':
        out += '\t';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case '0':
        out += '\0';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      default:
        out += c;
    }
  }
}

std::vector<std::string_view> Split(std::string_view line) {
  std::vector<std::string_view> cells;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    cells.push_back(line.substr(start, tab == std::string_view::npos ? tab : tab - start));
    if (tab == std::string_view::npos) return cells;
    start = tab + 1;
  }
}

}  // namespace

Result<StoreUrl> StoreUrl::Parse(std::string_view url) {
  const std::string_view scheme = "clickhouse://";
  const std::string shown(url);
  if (!url.starts_with(scheme))
    return InvalidArgument("store '" + shown +
                           "': expected clickhouse://[USER[:PASSWORD]@]HOST[:PORT][/DATABASE]"
                           "[?cluster=NAME]");
  std::string_view rest = url.substr(scheme.size());
  StoreUrl u;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    std::string_view query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    while (!query.empty()) {
      const size_t amp = query.find('&');
      const std::string_view kv = query.substr(0, amp);
      query = amp == std::string_view::npos ? "" : query.substr(amp + 1);
      const size_t eq = kv.find('=');
      const std::string_view key = kv.substr(0, eq);
      const std::string value =
          eq == std::string_view::npos ? "" : PercentDecode(kv.substr(eq + 1));
      if (key == "cluster" && ValidIdentifier(value)) {
        u.cluster = value;
      } else {
        return InvalidArgument("store URL: unknown or bad parameter '" + std::string(kv) +
                               "' (only cluster=NAME)");
      }
    }
  }
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = cred.find(':');
    u.user = PercentDecode(cred.substr(0, colon));
    if (colon != std::string_view::npos) u.password = PercentDecode(cred.substr(colon + 1));
  }
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos && slash + 1 < rest.size()) {
    u.database = std::string(rest.substr(slash + 1));
    if (!ValidIdentifier(u.database))
      return InvalidArgument("store URL: database '" + u.database +
                             "' must be letters, digits and underscores");
  }
  if (const size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    const std::string_view port = hostport.substr(colon + 1);
    if (std::from_chars(port.data(), port.data() + port.size(), u.port).ec != std::errc() ||
        u.port <= 0 || u.port > 65535)
      return InvalidArgument("store URL: bad port '" + std::string(port) + "'");
    hostport = hostport.substr(0, colon);
  }
  if (hostport.empty()) return InvalidArgument("store URL '" + shown + "' names no host");
  u.host = std::string(hostport);
  return u;
}

std::string StoreUrl::Redacted() const {
  return "clickhouse://" + (user.empty() ? "" : user + (password.empty() ? "" : ":***") + "@") +
         host + ":" + std::to_string(port) + "/" + database +
         (cluster.empty() ? "" : "?cluster=" + cluster);
}

std::string StoreUrl::HttpBase() const {
  return "http://" + host + ":" + std::to_string(port) + "/";
}

void AppendTsv(std::string& out, std::string_view text) {
  for (const char c : text) {
    switch (c) {
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\0':
        out += "\\0";
        break;
      default:
        out += c;
    }
  }
}

ClickHouse::ClickHouse(StoreUrl url, int timeout_ms)
    : url_(std::move(url)), timeout_ms_(timeout_ms) {}

std::string ClickHouse::Table(std::string_view name) const {
  return url_.database + "." + std::string(name);
}

Result<std::string> ClickHouse::Post(std::string_view query_param, std::string_view body,
                                     std::string_view settings) {
  std::string target = url_.HttpBase() + "?";
  if (!query_param.empty()) target += "query=" + PercentEncode(query_param) + "&";
  target += std::string(settings);
  std::vector<std::string> headers;
  if (!url_.user.empty()) headers.push_back("X-ClickHouse-User: " + url_.user);
  if (!url_.password.empty()) headers.push_back("X-ClickHouse-Key: " + url_.password);
  auto got = HttpPost(target, body, headers, timeout_ms_);
  if (got.ok()) return got;
  const Status failed = got.status();
  const std::string& m = failed.message();
  const std::string where = "ClickHouse at " + url_.Redacted() + ": ";
  const size_t http = m.find(" answered HTTP ");
  if (http == std::string::npos) {  // no answer: the transport's own words, the URL redacted
    const size_t colon = m.find(": ");
    const std::string why = colon == std::string::npos ? m : m.substr(colon + 2);
    return Status(got.status().code(),
                  where + (got.status().code() == StatusCode::kDeadlineExceeded
                               ? "no answer within " + std::to_string(timeout_ms_) + " ms"
                               : "cannot connect (" + why + ")"));
  }
  int code = 0;
  std::from_chars(m.data() + http + 15, m.data() + m.size(), code);
  const size_t colon = m.find(": ", http);
  const std::string msg =
      where +
      ServerMessage(colon == std::string::npos ? "" : std::string_view(m).substr(colon + 2));
  if (code == 401 || code == 403 || code == 516) return PermissionDenied(msg);
  if (code == 404) return NotFound(msg);
  if (code == 400) return InvalidArgument(msg);
  return Status(StatusCode::kUnavailable, msg);
}

Status ClickHouse::Exec(std::string_view sql, bool in_database) {
  return Post("", sql, in_database ? "database=" + url_.database : "").status();
}

Status ClickHouse::Insert(std::string_view table, std::string_view columns, std::string_view rows) {
  const std::string q =
      "INSERT INTO " + Table(table) + " (" + std::string(columns) + ") FORMAT TabSeparated";
  // Into a Distributed table: acknowledged only once every shard has its rows.
  return Post(q, rows, url_.cluster.empty() ? "" : "insert_distributed_sync=1").status();
}

Result<StoreRows> ClickHouse::Select(std::string_view sql, std::string_view settings) {
  ASSIGN_OR_RETURN(
      const std::string body,
      Post("", std::string(sql) + "\nFORMAT TabSeparatedWithNamesAndTypes",
           "database=" + url_.database + (settings.empty() ? "" : "&") + std::string(settings)));
  StoreRows out;
  std::string_view rest = body;
  int line_no = 0;
  std::string cell;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? "" : rest.substr(nl + 1);
    std::vector<std::string> cells;
    std::vector<bool> nulls;
    for (const std::string_view c : Split(line)) {
      nulls.push_back(c == "\\N");
      Unescape(nulls.back() ? "" : c, cell);
      cells.push_back(cell);
    }
    if (line_no == 0) {
      out.names = std::move(cells);
    } else if (line_no == 1) {
      out.types = std::move(cells);
    } else {
      if (cells.size() != out.names.size())
        return DataLoss("ClickHouse at " + url_.Redacted() + " answered a row of " +
                        std::to_string(cells.size()) + " cells for " +
                        std::to_string(out.names.size()) + " columns");
      out.rows.push_back(std::move(cells));
      out.null.push_back(std::move(nulls));
    }
    ++line_no;
  }
  return out;
}

Result<std::string> ClickHouse::Scalar(std::string_view sql) {
  ASSIGN_OR_RETURN(StoreRows r, Select(sql));
  if (r.rows.empty() || r.rows[0].empty() || r.null[0][0]) return std::string();
  return r.rows[0][0];
}

}  // namespace megascope::tracer
