// `megascope store init|status|prune --store URL`: the fleet's ClickHouse store's schema, what it
// holds, and its retention (docs/formats.md section 4b). Agents create a new store's schema
// themselves; `init` migrates an older one (agents refuse it: many at once would race), and is for
// each shard of a cluster (18.16 has no ON CLUSTER without ZooKeeper) and for checking a store
// before a job. `prune` is retention: run it daily (cron, a systemd timer) on
// each server.
#include <chrono>
#include <cstdio>

#include "command.h"
#include "megascope/tracer/clickhouse.h"
#include "megascope/tracer/store_schema.h"

namespace megascope::cli {

int RunStore(const Args& args) {
  std::string action, store;
  int raw_days = tracer::DefaultRetentionDays(tracer::StoreRetention::kRaw);
  int collective_days = tracer::DefaultRetentionDays(tracer::StoreRetention::kCollectives);
  po::options_description opts("Options");
  opts.add_options()("help,h", "show this help")(
      "action", po::value(&action)->required(),
      "init (create or migrate the schema), status (version, rows and bytes per table) or prune "
      "(drop the day partitions past retention)")(
      "store", po::value(&store),
      "clickhouse://[USER[:PASSWORD]@]HOST[:8123][/DATABASE][?cluster=NAME] (default "
      "$MEGASCOPE_STORE)")("raw-days", po::value(&raw_days)->default_value(raw_days),
                           "prune: days of spans, heartbeats, metrics, drops, device spans and "
                           "open ops kept (0: for ever)")(
      "collective-days", po::value(&collective_days)->default_value(collective_days),
      "prune: days of collectives and per-step sums kept (0: for ever); ranks and events are "
      "kept for ever");
  po::positional_options_description pos;
  pos.add("action", 1);
  po::variables_map vm;
  if (auto rc =
          ParseArgs("store", "megascope store init|status|prune --store URL", args, opts, pos, &vm))
    return *rc;
  if (store.empty()) {
    if (const char* env = std::getenv("MEGASCOPE_STORE"); env != nullptr) store = env;
  }
  if (store.empty()) return Fail("store", "give --store URL (or set MEGASCOPE_STORE)", kExitUsage);
  auto url = tracer::StoreUrl::Parse(store);
  if (!url.ok()) return Fail("store", url.status().message(), kExitUsage);
  if (action != "init" && action != "status" && action != "prune")
    return Fail("store", "unknown action '" + action + "' (init, status or prune)", kExitUsage);
  tracer::ClickHouse ch(*url, 600000);
  if (action == "init") {
    auto before = tracer::StoreSchemaVersion(ch);
    if (before.ok() && *before > 0 && *before < tracer::kStoreSchemaVersion)
      std::printf("%s: schema version %d, migrating to %d\n", url->Redacted().c_str(), *before,
                  tracer::kStoreSchemaVersion);
    const auto say = [](const std::string& line) {
      std::printf("  %s\n", line.c_str());
      std::fflush(stdout);
    };
    if (Status st = tracer::EnsureStoreSchema(ch, tracer::OlderStore::kMigrate, say); !st.ok())
      return Fail("store", st.message());
    std::printf("%s: schema version %d, %zu tables%s\n", url->Redacted().c_str(),
                tracer::kStoreSchemaVersion, tracer::StoreTables().size(),
                url->cluster.empty() ? ""
                                     : " (this shard's, and the Distributed tables over the "
                                       "cluster)");
    return 0;
  }
  if (action == "prune") {
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    auto dropped = tracer::PruneStore(ch, {raw_days, collective_days, 0}, now);
    if (!dropped.ok()) return Fail("store", dropped.status().message());
    std::printf("%s: %d day partitions dropped\n", url->Redacted().c_str(), *dropped);
    return 0;
  }
  auto version = tracer::StoreSchemaVersion(ch);
  if (!version.ok()) return Fail("store", version.status().message());
  std::printf("%s: schema version %d (this build: %d)\n", url->Redacted().c_str(), *version,
              tracer::kStoreSchemaVersion);
  if (*version == 0) return 0;
  auto parts = ch.Select(
      "SELECT table, sum(rows), sum(bytes_on_disk), min(partition), max(partition) FROM "
      "system.parts WHERE database = '" +
      url->database + "' AND active GROUP BY table ORDER BY table");
  if (!parts.ok()) return Fail("store", parts.status().message());
  std::printf("%-16s %14s %14s  %s\n", "table", "rows", "bytes", "days");
  for (const auto& r : parts->rows)
    std::printf("%-16s %14s %14s  %s .. %s\n", r[0].c_str(), r[1].c_str(), r[2].c_str(),
                r[3].c_str(), r[4].c_str());
  return 0;
}

}  // namespace megascope::cli
