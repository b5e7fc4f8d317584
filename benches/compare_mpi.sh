#!/usr/bin/env bash
# Collectives of jaccl against Open MPI, side by side on this machine: shared memory (Open
# MPI's default, vader, against `jaccl bench --transport shm`) and TCP over loopback (`mpirun
# --mca btl tcp,self` against `--transport tcp`).
#
#   benches/compare_mpi.sh [-r REPS] [-n "2 4"] [-s 8,64K,4M,32M] [-O "broadcast all-to-all"]
#                          [-t "shm tcp"] [-o FILE.jsonl]
#
# Per repetition (default 3), rank count, operation and transport, Open MPI and jaccl run one
# after the other, in an order that alternates between repetitions; the table shows each one's
# best time per size (µs) and jaccl's speed-up (MPI's time / jaccl's: above 1 is faster).
# -O picks the operations: broadcast, all-to-all, all-gather, reduce-scatter, reduce, gather,
# scatter, all-reduce (reductions sum, rooted ones from or to rank 0); -t the transports.
# Sizes are bytes of u8 elements, as `jaccl bench` and nccl-tests count them: the message of
# broadcast, reduce and all-reduce; each rank's input of all-to-all (size / N to every rank)
# and reduce-scatter (size / N comes out); the output of all-gather and the root's of gather,
# the root's input of scatter (size / N from or to every rank). Where an operation cuts a size
# into N blocks, a size under N bytes becomes N. Every run checks its results.
# Needs mpicc and mpirun (Debian: openmpi-bin libopenmpi-dev) and builds jaccl in release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
reps=3 ranks="2 4" sizes=8,64K,4M,32M out="" ops="broadcast all-to-all" transports="shm tcp"
while getopts "r:n:s:o:O:t:h" opt; do
  case "$opt" in
    r) reps=$OPTARG ;; n) ranks=$OPTARG ;; s) sizes=$OPTARG ;; o) out=$OPTARG ;;
    O) ops=$OPTARG ;; t) transports=$OPTARG ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
mpi_name() {  # jaccl bench's op name -> mpi_collectives' (empty: unknown)
  case $1 in
    broadcast) echo bcast ;; all-to-all) echo alltoall ;; all-gather) echo allgather ;;
    reduce-scatter) echo reducescatter ;; reduce) echo reduce ;; gather) echo gather ;;
    scatter) echo scatter ;; all-reduce) echo allreduce ;;
  esac
}
for op in $ops; do
  if [[ -z $(mpi_name "$op") ]]; then
    echo "compare_mpi.sh: unknown operation $op (-O takes broadcast, all-to-all, all-gather," \
      "reduce-scatter, reduce, gather, scatter, all-reduce)" >&2
    exit 2
  fi
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

bytes() {  # a size (8, 64K, 4M...) in bytes, or as it is if not one
  local v=${1%[KkMmGgBb]}
  [[ $v =~ ^[0-9]+$ ]] || { echo "$1"; return; }
  case $1 in
    *[Kk]) echo $((v << 10)) ;; *[Mm]) echo $((v << 20)) ;; *[Gg]) echo $((v << 30)) ;;
    *) echo "$v" ;;
  esac
}

sizes_for() {  # ranks op: the sizes to run, a size under N bytes made N where op cuts N blocks
  case $2 in
    all-to-all | all-gather | reduce-scatter | gather | scatter) ;;
    *) echo "${size_list[@]}"; return ;;
  esac
  local s b seen=" " list=()
  for s in "${size_list[@]}"; do
    b=$(bytes "$s")
    if [[ $b =~ ^[0-9]+$ ]] && (( b < $1 )); then
      echo "compare_mpi.sh: $2 on $1 ranks: $s bytes is under a byte per rank; $1 instead" >&2
      s=$1
    fi
    [[ $seen == *" $s "* ]] || list+=("$s")
    seen+="$s "
  done
  echo "${list[@]}"
}

mpi() {  # ranks op transport sizes...
  local n=$1 op t=$3 btl=()
  op=$(mpi_name "$2")
  shift 3
  [[ $t == tcp ]] && btl=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
    --mca oob_tcp_if_include lo "${btl[@]}" "$work/mpi_collectives" "$op" "$(IFS=,; echo "$*")" \
    "$t" >> "$out"
}

jaccl() {  # ranks op transport sizes...
  local n=$1 op=$2 t=$3 s
  shift 3
  for s in "$@"; do
    "$jaccl" bench -n "$n" --op "$op" --dtype u8 -b "$s" -e "$s" --transport "$t" \
      --json "$work/row.jsonl" > /dev/null
    cat "$work/row.jsonl" >> "$out"
  done
}

for ((rep = 0; rep < reps; rep++)); do
  for n in $ranks; do
    for op in $ops; do
      for t in $transports; do
        echo "compare_mpi.sh: repetition $((rep + 1))/$reps: N=$n $op over $t" >&2
        read -r -a run_sizes <<< "$(sizes_for "$n" "$op")"
        if (( rep % 2 == 0 )); then
          mpi "$n" "$op" "$t" "${run_sizes[@]}"; jaccl "$n" "$op" "$t" "${run_sizes[@]}"
        else
          jaccl "$n" "$op" "$t" "${run_sizes[@]}"; mpi "$n" "$op" "$t" "${run_sizes[@]}"
        fi
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
