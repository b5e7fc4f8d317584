#!/usr/bin/env bash
# Pretend hosts on this machine, for jobs that span several "hosts" without having them: each
# host a network namespace (so its ranks see their own network, and jaccl's host identity,
# which includes the namespace, tells the hosts apart), all joined through a switch namespace
# by veth pairs, each host's link limited to RATE each way by tc's token bucket (tbf).
#
#   scripts/pretend-hosts.sh up H [RATE] [HOSTFILE]   # H hosts (default rate 1gbit), writes
#                                                     # a hostfile (default pretend-hosts.json)
#   scripts/pretend-hosts.sh down                     # removes the pretend hosts and the switch
#
# Then, as root, the hostfile's hosts are namespaces that `jaccl launch` starts ranks in:
#
#   cargo build --release
#   target/release/jaccl launch --hostfile pretend-hosts.json -n 4 -- \
#     "$PWD/target/release/jaccl" bench --op all-reduce
#
# runs 4 ranks on each host: shared memory between the ranks of one host, TCP between hosts
# over links of RATE. RATE is tc's (1gbit, 10gbit, 500mbit). Host i is 10.77.0.(i+1), in the
# namespace jaccl-host<i> (PRETEND_HOSTS_NAME=x: x-host<i>). Needs root and iproute2. (Delay
# and loss would need tc netem, which not every kernel has.)
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }

# PRETEND_HOSTS_NAME (default jaccl) names the set, so that several can coexist (the tests').
NAME=${PRETEND_HOSTS_NAME:-jaccl}
[[ $NAME =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || {
  echo "pretend-hosts.sh: PRETEND_HOSTS_NAME must be lower-case letters, digits and -" >&2
  exit 2
}
SWITCH=$NAME-switch
PREFIX=$NAME-host

down() {
  ip netns list | awk '{print $1}' | grep -E "^($PREFIX[0-9]+|$SWITCH)$" | while read -r ns; do
    ip netns del "$ns"
  done || true
}

# tbf's bucket: a millisecond's worth of bytes (a bigger one lets a message of that size pass
# unshaped), at least 64 KiB (veth hands over segments of up to 64 KiB; tbf drops larger ones).
burst_of() {
  local rate=${1%bit} bits
  bits=$(numfmt --from=si "${rate^^}" 2>/dev/null) || return 1
  echo $(( bits / 8000 > 65536 ? bits / 8000 : 65536 ))
}

up() {
  (( $# >= 1 )) || usage
  local hosts=$1 rate=${2:-1gbit} file=${3:-pretend-hosts.json}
  [[ $hosts =~ ^[0-9]+$ ]] && (( hosts >= 1 && hosts <= 200 )) || {
    echo "pretend-hosts.sh: H must be 1 to 200, not '$hosts'" >&2
    exit 2
  }
  local burst
  burst=$(burst_of "$rate") || { echo "pretend-hosts.sh: bad rate '$rate'" >&2; exit 2; }
  down
  # Half-made hosts go again if any step fails.
  trap 'down; echo "pretend-hosts.sh: failed; removed what was made" >&2' ERR
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  local entries=()
  for ((i = 0; i < hosts; i++)); do
    local ns=$PREFIX$i addr=10.77.0.$((i + 1))
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "h$i" netns "$ns" type veth peer name "s$i" netns "$SWITCH"
    ip -n "$ns" addr add "$addr/24" dev "h$i"
    ip -n "$ns" link set "h$i" up
    ip -n "$SWITCH" link set "s$i" master br0
    ip -n "$SWITCH" link set "s$i" up
    # Both directions of the host's link: out of the host, and out of the switch to it.
    tc -n "$ns" qdisc add dev "h$i" root tbf rate "$rate" burst "$burst" latency 100ms
    tc -n "$SWITCH" qdisc add dev "s$i" root tbf rate "$rate" burst "$burst" latency 100ms
    entries+=("{\"netns\": \"$ns\", \"ips\": [\"$addr\"]}")
  done
  (IFS=,; echo "[${entries[*]}]") > "$file"
  trap - ERR
  echo "pretend-hosts.sh: $hosts host(s) at $rate each way, hostfile $file"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  *) usage ;;
esac
