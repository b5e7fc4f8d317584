#!/usr/bin/env bash
# Broadcast, all-to-all and all-gather of jaccl against Open MPI, side by side on this
# machine: shared memory (Open MPI's default, vader, against `jaccl bench --transport shm`) and
# TCP over loopback (`mpirun --mca btl tcp,self` against `--transport tcp`).
#
#   benches/compare_mpi.sh [-r REPS] [-n "2 4"] [-s 8,64K,4M,32M] [-O "broadcast all-to-all"]
#                          [-t "shm tcp"] [-o FILE.jsonl]
#
# Per repetition (default 3), rank count, operation and transport, Open MPI and jaccl run one
# after the other, in an order that alternates between repetitions; the table shows each one's
# best time per size (µs) and jaccl's speed-up (MPI's time / jaccl's: above 1 is faster).
# Sizes are bytes of u8 elements: broadcast's message, all-to-all's input per rank (size / N to
# every rank), all-gather's output (size / N from every rank), as `jaccl bench` and nccl-tests
# count them. -O picks the operations (also all-gather), -t the transports. Every run checks
# its results.
# Needs mpicc and mpirun (Debian: openmpi-bin libopenmpi-dev) and builds jaccl in release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
reps=3 ranks="2 4" sizes=8,64K,4M,32M out="" ops="broadcast all-to-all" transports="shm tcp"
while getopts "r:n:s:o:O:t:h" opt; do
  case "$opt" in
    r) reps=$OPTARG ;; n) ranks=$OPTARG ;; s) sizes=$OPTARG ;; o) out=$OPTARG ;;
    O) ops=$OPTARG ;; t) transports=$OPTARG ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/jaccl-compare.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=${out:-target/compare-mpi-$(date +%Y%m%d-%H%M%S).jsonl}
mkdir -p "$(dirname "$out")"
: > "$out"
cargo build --release --locked -q -p jaccl-cli
jaccl=$PWD/target/release/jaccl
mpicc -O2 -o "$work/mpi_collectives" benches/mpi_collectives.c -lm
IFS=, read -r -a size_list <<< "$sizes"

mpi() {  # ranks op transport
  local btl=()
  [[ $3 == tcp ]] && btl=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
  local op=bcast
  [[ $2 == all-to-all ]] && op=alltoall
  [[ $2 == all-gather ]] && op=allgather
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$1" \
    --mca oob_tcp_if_include lo "${btl[@]}" "$work/mpi_collectives" "$op" "$sizes" "$3" >> "$out"
}

jaccl() {  # ranks op transport
  for s in "${size_list[@]}"; do
    "$jaccl" bench -n "$1" --op "$2" --dtype u8 -b "$s" -e "$s" --transport "$3" \
      --json "$work/row.jsonl" > /dev/null
    cat "$work/row.jsonl" >> "$out"
  done
}

for ((rep = 0; rep < reps; rep++)); do
  for n in $ranks; do
    for op in $ops; do
      for t in $transports; do
        echo "compare_mpi.sh: repetition $((rep + 1))/$reps: N=$n $op over $t" >&2
        if (( rep % 2 == 0 )); then mpi "$n" "$op" "$t"; jaccl "$n" "$op" "$t"
        else jaccl "$n" "$op" "$t"; mpi "$n" "$op" "$t"; fi
      done
    done
  done
done

python3 - "$out" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if not r.get("ok", False):
        sys.exit(f"wrong results: {line}")
    key = (r["op"], r["transport"], r["n"], r["bytes"], r["peer"])
    best[key] = min(best.get(key, float("inf")), r["time_us"])
rows = sorted({k[:4] for k in best})
print("| op | transport | N | bytes | Open MPI µs | jaccl µs | speed-up |")
print("|---|---|---:|---:|---:|---:|---:|")
for op, t, n, b in rows:
    m, j = best.get((op, t, n, b, "openmpi")), best.get((op, t, n, b, "jaccl"))
    if m is None or j is None:
        continue
    print(f"| {op} | {t} | {n} | {b} | {m:.4g} | {j:.4g} | {m / j:.2f}× |")
PY
echo "compare_mpi.sh: every row in $out" >&2
