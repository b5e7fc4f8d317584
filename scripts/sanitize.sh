#!/usr/bin/env bash
# AddressSanitizer (nightly) over the code that touches memory other processes share or that
# peers' bytes drive: the unit tests of the algorithms (the engine over misbehaving fake links,
# the plans) and of shared memory (segments, rings, hostile cursors), and the multi-rank tests
# of the direct collectives over real shared memory. A report fails the script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RUSTFLAGS="-Zsanitizer=address" ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
asan=(cargo +nightly test --target x86_64-unknown-linux-gnu --target-dir target/asan -p jaccl)
"${asan[@]}" --lib -- algo:: transport::shm
JACCL_TEST_NETS=shm "${asan[@]}" --test collectives -- shared_memory_sizes wrappers_raw_api
