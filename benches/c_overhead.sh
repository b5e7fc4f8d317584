#!/usr/bin/env bash
# What the C interface costs over the Rust API: the same all-reduce loop (f32 sum, out of
# place) through each (benches/c_allreduce_loop.c, crates/jaccl/examples/allreduce_loop.rs),
# under `jaccl launch` on this machine, at 8 B and 4 MiB on 2 and 4 ranks, interleaved
# (C and Rust alternate, which goes first alternating by round); prints each configuration's
# median over the rounds and the ratio C / Rust. First a group of one at 8 B: no
# communication at all, so the difference is the C path's own cost per call.
#
#   benches/c_overhead.sh [ROUNDS]        # default 7
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${1:-7}

cargo build -q --release --locked -p jaccl-c -p jaccl-cli
cargo build -q --release --locked -p jaccl --example allreduce_loop
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -std=c99 -O2 -D_POSIX_C_SOURCE=200809L -Icrates/jaccl-c/include benches/c_allreduce_loop.c \
  -L"$bin" -Wl,-rpath,"$bin" -ljaccl -o "$work/c_loop"

one() {  # API RANKS BYTES ITERS
  local program=$work/c_loop
  [[ $1 == rust ]] && program=$bin/examples/allreduce_loop
  "$bin/jaccl" launch -n "$2" "$program" "$3" "$4" | sed -n 's/.*us_per_call //p'
}

printf '# %-5s %7s %9s %12s %12s %8s\n' ranks bytes iters "C (us)" "Rust (us)" "C/Rust"
for ranks in 1 2 4; do
  specs=("8 20000" "4194304 40")
  (( ranks == 1 )) && specs=("8 2000000")
  for spec in "${specs[@]}"; do
    read -r bytes iters <<< "$spec"
    c=() rust=()
    for ((round = 0; round < rounds; round++)); do
      if (( round % 2 )); then
        rust+=("$(one rust "$ranks" "$bytes" "$iters")"); c+=("$(one c "$ranks" "$bytes" "$iters")")
      else
        c+=("$(one c "$ranks" "$bytes" "$iters")"); rust+=("$(one rust "$ranks" "$bytes" "$iters")")
      fi
    done
    python3 - "$ranks" "$bytes" "$iters" "${c[*]}" "${rust[*]}" <<'PY'
import statistics, sys
ranks, size, iters, c, rust = sys.argv[1:]
c = [float(x) for x in c.split()]
rust = [float(x) for x in rust.split()]
mc, mr = statistics.median(c), statistics.median(rust)
print(f"  {ranks:>5} {size:>7} {iters:>9} {mc:12.3f} {mr:12.3f} {mc / mr:8.3f}"
      f"   C: {min(c):.3f}-{max(c):.3f}  Rust: {min(rust):.3f}-{max(rust):.3f}")
PY
  done
done
