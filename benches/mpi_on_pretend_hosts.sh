#!/usr/bin/env bash
# Open MPI and jaccl side by side on pretend hosts (scripts/pretend-hosts.sh): H network
# namespaces at RATE each way, L ranks in each, the same collective and sizes, one after the
# other. Open MPI starts ranks on other hosts over ssh, so each namespace gets an sshd of its
# own (a key made for the run, in a temporary directory), and a host name of its own (a UTS
# namespace), so that Open MPI tells the hosts apart and uses TCP between them (shared memory,
# `vader`, within each).
#
#   benches/mpi_on_pretend_hosts.sh [-H 2] [-L 4] [-r 1gbit] [-O all-reduce] [-s 8,64K,4M,32M]
#                                   [-e JACCL_LINK=1Gb/s,6us]
#
# Prints, per size, Open MPI's time and jaccl's (µs; the bench's mean per call, out of place)
# and jaccl's speed-up (above 1: jaccl is faster). Operations as benches/compare_mpi.sh (u8,
# sums), and barrier (`-O barrier -s 0`). Open MPI is told to yield when idle (`mpi_yield_when_idle`), as `--oversubscribe`
# does on one host: the ranks outnumber the cores. Needs root, mpicc, mpirun, sshd; builds
# jaccl in release. -e sets a variable for jaccl's ranks (its links' figures, say). Removes the
# pretend hosts and the sshds when done.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hosts=2 per_host=4 rate=1gbit op=all-reduce sizes=8,64K,4M,32M jaccl_env=()
while getopts "H:L:r:O:s:e:h" opt; do
  case "$opt" in
    H) hosts=$OPTARG ;; L) per_host=$OPTARG ;; r) rate=$OPTARG ;; O) op=$OPTARG ;;
    s) sizes=$OPTARG ;; e) jaccl_env+=("$OPTARG") ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
case $op in
  broadcast) mpi_op=bcast ;; all-to-all) mpi_op=alltoall ;; all-gather) mpi_op=allgather ;;
  reduce-scatter) mpi_op=reducescatter ;; reduce) mpi_op=reduce ;; gather) mpi_op=gather ;;
  scatter) mpi_op=scatter ;; all-reduce) mpi_op=allreduce ;; barrier) mpi_op=barrier ;;
  *) echo "mpi_on_pretend_hosts.sh: unknown operation $op" >&2; exit 2 ;;
esac
for tool in mpicc mpirun /usr/sbin/sshd; do
  command -v "$tool" > /dev/null || { echo "mpi_on_pretend_hosts.sh: needs $tool" >&2; exit 2; }
done

work=$(mktemp -d)
export PRETEND_HOSTS_NAME=ompi
cleanup() {
  for pid in "$work"/sshd-*.pid; do
    [[ -f $pid ]] && kill "$(cat "$pid")" 2> /dev/null || true
  done
  scripts/pretend-hosts.sh down
  rm -rf "$work"
}
trap cleanup EXIT

cargo build --release -q -p jaccl-cli
jaccl=$PWD/target/release/jaccl
mpicc -O2 -o "$work/mpi_collectives" benches/mpi_collectives.c -lm
scripts/pretend-hosts.sh up "$hosts" "$rate" "$work/hosts.json"

# A key for this run; each host's sshd listens on its address alone.
ssh-keygen -q -t ed25519 -N "" -f "$work/key"
ssh-keygen -q -t ed25519 -N "" -f "$work/host_key"
cp "$work/key.pub" "$work/authorized_keys"
mkdir -p /run/sshd
ssh_opts="-i $work/key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
list=()
for ((i = 0; i < hosts; i++)); do
  addr=10.77.0.$((i + 1))
  ip netns exec "ompi-host$i" unshare --uts sh -c "hostname pretend$i; exec /usr/sbin/sshd \
    -o ListenAddress=$addr -o HostKey=$work/host_key -o AuthorizedKeysFile=$work/authorized_keys \
    -o PermitRootLogin=prohibit-password -o StrictModes=no -o PidFile=$work/sshd-$i.pid"
  list+=("$addr:$per_host")
done
for ((i = 1; i < hosts; i++)); do  # every sshd answers before mpirun needs it
  for _ in $(seq 50); do
    ip netns exec ompi-host0 ssh $ssh_opts "10.77.0.$((i + 1))" true 2> /dev/null && break
    sleep 0.1
  done
done

(IFS=,; ip netns exec ompi-host0 unshare --uts sh -c "hostname pretend0; mpirun \
  --allow-run-as-root -H ${list[*]} --bind-to none --mca plm_rsh_args '$ssh_opts' \
  --mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
  --mca oob_tcp_if_include 10.77.0.0/24 --mca mpi_yield_when_idle 1 \
  -x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  $work/mpi_collectives $mpi_op $sizes") > "$work/mpi.jsonl"

: > "$work/jaccl.txt"
for size in ${sizes//,/ }; do
  env "${jaccl_env[@]}" "$jaccl" launch --hostfile "$work/hosts.json" -n "$per_host" -- "$jaccl" bench --op "$op" \
    --dtype u8 -b "$size" -e "$size" 2>&1 | awk -v s="$size" '/^\[0\] +[0-9]/ { print s, $2, $6 }' \
    >> "$work/jaccl.txt"
done

python3 - "$work/mpi.jsonl" "$work/jaccl.txt" "$op" "$hosts" "$per_host" "$rate" <<'EOF'
import json, sys
mpi = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
# jaccl's lines: the size asked for (as written), the bytes of its row and its time.
jaccl = [l.split() for l in open(sys.argv[2]) if l.strip()]
if len(mpi) != len(jaccl):
    sys.exit(f"mpi_on_pretend_hosts.sh: {len(mpi)} Open MPI rows against {len(jaccl)} of jaccl")
op, hosts, per_host, rate = sys.argv[3:7]
print(f"# {op} on {hosts} pretend hosts x {per_host} ranks at {rate}: time per call (us)")
print(f"{'bytes':>10} {'Open MPI':>12} {'jaccl':>12} {'speed-up':>9}")
for m, (_, size, t) in zip(mpi, jaccl):
    if int(size) != m["bytes"]:
        sys.exit(f"mpi_on_pretend_hosts.sh: Open MPI measured {m['bytes']} B where jaccl did {size}")
    t = float(t)
    print(f"{m['bytes']:>10} {m['time_us']:>12.1f} {t:>12.1f} {m['time_us'] / t:>8.2f}x")
EOF
