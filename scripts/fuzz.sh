#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS each (default 45; CI's .ci/run uses the
# default), from the corpus in fuzz/corpus/TARGET; inputs that find new paths go to a scratch
# directory, not the repository. Prints each target's executions; a crash fails the script
# and leaves the input under fuzz/artifacts/. Needs the nightly toolchain, and cargo-fuzz
# (installed from crates.io when missing). A longer run: scripts/fuzz.sh 3600.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
seconds=${1:-45}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
cargo +nightly fuzz build -O
for target in $(cargo +nightly fuzz list); do
  scratch=$(mktemp -d)
  log=$(mktemp)
  if ! cargo +nightly fuzz run -O "$target" "$scratch" "corpus/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz.sh: $target FAILED" >&2
    exit 1
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  echo "fuzz.sh: $target: $runs in $seconds s, $cov, no crash"
  rm -rf "$scratch" "$log"
done
