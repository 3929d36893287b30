#!/usr/bin/env bash
# The fleet's ClickHouse store against trace.db (bench/store_scale.cc): starts Debian's
# clickhouse-server on a free loopback port with its data in a temporary directory, runs the
# benchmark against it, then the controller's tick over the agents beside it (bench/fleet_scale),
# stops it.
#
# Usage: bench/store_scale.sh [NODES=200] [hour] [BIN=build/release/bench/store_scale]
# Output: the benchmark's lines, kept in bench/results/store_scale.txt by whoever runs it (with
# the command).
set -euo pipefail
nodes=${1:-200}
hour=${2:-}
bin=${3:-build/release/bench/store_scale}
server=/usr/sbin/clickhouse-server
[[ -x $bin ]] || { echo "store_scale: $bin not built (cmake --build --preset release --target store_scale)" >&2; exit 2; }
[[ -x $server ]] || { echo "store_scale: $server missing (scripts/setup.sh installs it)" >&2; exit 2; }
dir=$(mktemp -d /tmp/store_scale.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
tcp=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$dir/config.xml" <<XML
<?xml version="1.0"?><yandex><logger><level>warning</level><log>$dir/server.log</log>
<errorlog>$dir/server.err.log</errorlog><size>10M</size><count>1</count></logger>
<http_port>$port</http_port><tcp_port>$tcp</tcp_port><listen_host>127.0.0.1</listen_host>
<path>$dir/data/</path><tmp_path>$dir/tmp/</tmp_path><user_files_path>$dir/user_files/</user_files_path>
<format_schema_path>$dir/format_schemas/</format_schema_path><users_config>$dir/users.xml</users_config>
<default_profile>default</default_profile><default_database>default</default_database>
<mark_cache_size>1073741824</mark_cache_size><uncompressed_cache_size>1073741824</uncompressed_cache_size></yandex>
XML
cat > "$dir/users.xml" <<XML
<?xml version="1.0"?><yandex><profiles><default><max_memory_usage>16000000000</max_memory_usage></default></profiles>
<users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default></users>
<quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors><result_rows>0</result_rows>
<read_rows>0</read_rows><execution_time>0</execution_time></interval></default></quotas></yandex>
XML
"$server" --config-file="$dir/config.xml" > "$dir/stdout.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break
  sleep 0.1
done
echo "# command: bench/store_scale.sh $nodes $hour   ($(date -u +%F), $(nproc) cores, ClickHouse $(curl -s "http://127.0.0.1:$port/?query=SELECT%20version()"))"
"$bin" "clickhouse://127.0.0.1:$port/bench" "$nodes" $hour
# The controller's tick stays on the agents' /state (live; the store is a sink interval behind and
# says nothing of an agent that is down): measured here beside the server still holding the fleet.
fleet=$(dirname "$bin")/fleet_scale
if [[ -x $fleet ]]; then
  echo "# the agents' tick beside the store above: $fleet $nodes 8 1 tick"
  "$fleet" "$nodes" 8 1 tick 2>/dev/null | grep '^tick'
fi
