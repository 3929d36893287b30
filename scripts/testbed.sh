#!/usr/bin/env bash
# A test cluster of real hosts on this machine: network namespaces joined like the nodes of a
# training cluster.
#
#   scripts/testbed.sh up N     N hosts (idempotent: an existing testbed is reshaped to N hosts and
#                               every link fault on it is cleared)
#   scripts/testbed.sh down     removes every host, link and address it made (also after a crash)
#   scripts/testbed.sh status   the hosts file (below), or exit 1 when there is no testbed
#   scripts/testbed.sh check    exit 0 when network namespaces can be made here, else exit 2 with
#                               the reason (tests skip on it)
#
# Each host <P><i> (P = $MEGASCOPE_TESTBED, default "msh") is a network namespace with two links,
# as a GPU node has:
#   eth0  the backend (training) network: a veth to the port <P><i> of a bridge that lives in its
#         own namespace <P>sw (the switch), address 10.77.0.(11+i)/24. Collectives cross it; link
#         faults (tc rate limits, nft drops, link down) are applied to it.
#   mgmt  the frontend network: a veth to the bridge <P>mgmt in this machine's own namespace,
#         address 10.78.S.(11+i)/24 (this machine is 10.78.S.1; S = $MEGASCOPE_TESTBED_SUBNET,
#         default 0). Agents listen here and the controller reaches them here.
# The hosts file /run/megascope-testbed/<P>.hosts has one line per host:
#   NAME NETNS BACKEND_ADDR FRONTEND_ADDR SWITCH_NETNS:PORT
# `megascope launch --hosts testbed` reads it.
set -euo pipefail

P=${MEGASCOPE_TESTBED:-msh}
S=${MEGASCOPE_TESTBED_SUBNET:-0}  # frontend 10.78.S.0/24: two testbeds at once need two
[[ $S =~ ^[0-9]+$ ]] && ((S <= 255)) || { echo "testbed: MEGASCOPE_TESTBED_SUBNET must be 0..255" >&2; exit 2; }
STATE_DIR=/run/megascope-testbed
HOSTS_FILE=$STATE_DIR/$P.hosts
SW=${P}sw
MGMT=${P}mgmt

die() { echo "testbed: $*" >&2; exit 1; }
q() { "$@" >/dev/null 2>&1; }

check() {
  command -v ip >/dev/null || { echo "testbed: 'ip' (iproute2) is not installed (scripts/setup.sh)" >&2; return 2; }
  local probe="${P}probe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "testbed: cannot create network namespaces here: $err" >&2
    return 2
  fi
  if ! err=$(ip link add "${probe}a" type veth peer name "${probe}b" 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    echo "testbed: cannot create veth links here: $err" >&2
    return 2
  fi
  ip link del "${probe}a" 2>/dev/null || true
  ip netns del "$probe"
}

hosts_in_use() {  # the host namespaces that exist now
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${P}[0-9]+$" | sort -V || true
}

clear_faults() {  # host namespace
  local ns=$1
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  ip netns exec "$SW" tc qdisc del dev "$ns" root 2>/dev/null || true
  if command -v nft >/dev/null; then
    ip netns exec "$ns" nft delete table inet megascope_fault 2>/dev/null || true
  fi
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$SW" ip link set "$ns" up
}

add_host() {  # index
  local i=$1 ns="${P}$1"
  local data="10.77.0.$((11 + i))" front="10.78.$S.$((11 + i))"
  if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
    ip netns add "$ns"
  fi
  ip netns exec "$ns" ip link set lo up
  if ! q ip netns exec "$ns" ip link show eth0; then
    q ip netns exec "$SW" ip link del "$ns" || true
    ip link add "${ns}d" type veth peer name "${ns}s"
    ip link set "${ns}d" netns "$ns"
    ip netns exec "$ns" ip link set "${ns}d" name eth0
    ip link set "${ns}s" netns "$SW"
    ip netns exec "$SW" ip link set "${ns}s" name "$ns"
    ip netns exec "$SW" ip link set "$ns" master br0
  fi
  ip netns exec "$ns" ip addr replace "$data/24" dev eth0
  if ! q ip netns exec "$ns" ip link show mgmt; then
    q ip link del "${ns}m" || true
    ip link add "${ns}m" type veth peer name "${ns}f"
    ip link set "${ns}f" netns "$ns"
    ip netns exec "$ns" ip link set "${ns}f" name mgmt
    ip link set "${ns}m" master "$MGMT"
    ip link set "${ns}m" up
  fi
  ip netns exec "$ns" ip addr replace "$front/24" dev mgmt
  ip netns exec "$ns" ip link set mgmt up
  clear_faults "$ns"
  echo "$ns $ns $data $front $SW:$ns"
}

del_host() {  # namespace
  local ns=$1
  # Whatever still runs inside is killed: a host that is taken down is gone with its processes.
  local pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
  ip link del "${ns}m" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}

up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "usage: testbed.sh up N (1 <= N <= 200)"
  check || exit 2
  mkdir -p "$STATE_DIR"
  if ! ip netns list | awk '{print $1}' | grep -qx "$SW"; then ip netns add "$SW"; fi
  ip netns exec "$SW" ip link set lo up
  q ip netns exec "$SW" ip link show br0 || ip netns exec "$SW" ip link add br0 type bridge
  ip netns exec "$SW" ip link set br0 up
  q ip link show "$MGMT" || ip link add "$MGMT" type bridge
  ip addr replace "10.78.$S.1/24" dev "$MGMT"
  ip link set "$MGMT" up
  for ns in $(hosts_in_use); do
    local i=${ns#"$P"}
    ((i >= n)) && del_host "$ns"
  done
  local tmp="$HOSTS_FILE.tmp"
  : >"$tmp"
  for ((i = 0; i < n; i++)); do add_host "$i" >>"$tmp"; done
  mv "$tmp" "$HOSTS_FILE"
  echo "testbed: $n hosts up (${P}0..${P}$((n - 1)); backend 10.77.0.0/24, frontend 10.78.$S.0/24)" >&2
  cat "$HOSTS_FILE"
}

down() {
  for ns in $(hosts_in_use); do del_host "$ns"; done
  ip netns del "$SW" 2>/dev/null || true
  ip link del "$MGMT" 2>/dev/null || true
  rm -f "$HOSTS_FILE"
  echo "testbed: down" >&2
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) [[ -s $HOSTS_FILE ]] || { echo "testbed: no testbed (scripts/testbed.sh up N)" >&2; exit 1; }; cat "$HOSTS_FILE" ;;
  check) check ;;
  *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; [[ ${1:-} == -h || ${1:-} == --help ]] || exit 2 ;;
esac
