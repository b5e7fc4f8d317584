#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS each (default 60; CI, through scripts/test.sh,
# runs 30), from the corpus in fuzz/corpus/TARGET, as many targets at once as the
# machine has cores; inputs that find new paths go to a scratch directory, not the repository.
# Prints each target's executions; a crash fails the script and leaves the input under
# fuzz/artifacts/. Needs the nightly toolchain, and cargo-fuzz (installed from crates.io when
# missing). A longer run: scripts/fuzz.sh 3600.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
seconds=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
cargo +nightly fuzz build -O

fuzz_one() {  # TARGET: runs it, prints one line; a failure prints the log's tail
  local target=$1 scratch log runs cov
  scratch=$(mktemp -d)
  log=$(mktemp)
  if ! cargo +nightly fuzz run -O "$target" "$scratch" "corpus/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz.sh: $target FAILED" >&2
    return 1
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  echo "fuzz.sh: $target: $runs in $seconds s, $cov, no crash"
  rm -rf "$scratch" "$log"
}
export -f fuzz_one
export seconds
cargo +nightly fuzz list | xargs -P "$(nproc)" -I{} bash -c 'fuzz_one {}'
