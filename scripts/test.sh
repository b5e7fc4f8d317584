#!/usr/bin/env bash
# Runs every test of the workspace: `scripts/test.sh [cargo test arguments]`.
#
# The launcher's remote path is tested for real, over ssh to 127.0.0.1, `jaccl bench` under
# Open MPI's mpirun, and network faults between network namespaces the tests make. So, when
# run as root (CI, a fresh machine), this script first installs what those tests need (Debian
# packages openssh-server, openmpi-bin and iproute2), then starts
# a private sshd on a free port of 127.0.0.1 with a key made for this run (removed at exit).
# Without root or those packages, the tests that need them say so and are skipped, unless
# JACCL_REQUIRE_ALL=1 (set by .ci/run), which makes a missing prerequisite a failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need=()
command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || need+=(openssh-server)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v ip >/dev/null || need+=(iproute2)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# The C interface's tests build C and C++ programs with the installed pkg-config file and
# CMake package (crates/jaccl-c/tests/c_programs.rs).
command -v cmake >/dev/null || need+=(cmake)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v c++ >/dev/null || need+=(g++)
if (( ${#need[@]} )) && (( EUID == 0 )) && command -v apt-get >/dev/null; then
  echo "test.sh: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The RDMA VM (used at the end); its setup also installs libibverbs and its headers, which a
# unit test compares jaccl's declarations with.
RDMA_VM=""
for dir in "${JACCL_RDMA_VM:-}" ../shared/rdma-vm /work/shared/rdma-vm; do
  if [[ -n "$dir" && -x "$dir/setup.sh" ]]; then RDMA_VM=$(cd "$dir" && pwd); break; fi
done
if (( EUID == 0 )) && [[ -n "$RDMA_VM" ]]; then "$RDMA_VM/setup.sh" >/dev/null; fi

SSH_DIR=""
cleanup() {
  if [[ -n "$SSH_DIR" && -f "$SSH_DIR/sshd.pid" ]]; then kill "$(cat "$SSH_DIR/sshd.pid")" 2>/dev/null || true; fi
  [[ -n "$SSH_DIR" ]] && rm -rf "$SSH_DIR"
}
trap cleanup EXIT

SSHD=$(command -v sshd || echo /usr/sbin/sshd)
if [[ -x "$SSHD" ]] && (( EUID == 0 )); then
  SSH_DIR=$(mktemp -d /tmp/jaccl-test-ssh.XXXXXX)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  ssh-keygen -q -t ed25519 -N '' -f "$SSH_DIR/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$SSH_DIR/id_ed25519"
  cp "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
  cat > "$SSH_DIR/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $SSH_DIR/host_key
PidFile $SSH_DIR/sshd.pid
AuthorizedKeysFile $SSH_DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100
MaxSessions 100
LogLevel ERROR
CONF
  cat > "$SSH_DIR/ssh_config" <<CONF
Host *
  Port $port
  IdentityFile $SSH_DIR/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
CONF
  mkdir -p /run/sshd
  "$SSHD" -f "$SSH_DIR/sshd_config" -E "$SSH_DIR/sshd.log"
  export JACCL_SSH="ssh -F $SSH_DIR/ssh_config"
  for _ in $(seq 50); do
    $JACCL_SSH -o BatchMode=yes 127.0.0.1 true 2>/dev/null && break
    sleep 0.1
  done
  if $JACCL_SSH -o BatchMode=yes 127.0.0.1 true; then
    export JACCL_TEST_SSH=1
  else
    echo "test.sh: the private sshd does not answer:" >&2
    cat "$SSH_DIR/sshd.log" >&2 || true
  fi
else
  echo "test.sh: no sshd or not root: the ssh tests will be skipped" >&2
fi

# Each step's wall time, on stderr, so that CI's budget can be read off its log.
started=$SECONDS
step() { echo "test.sh: [$((SECONDS - started)) s] $*" >&2; }

target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p "$target"

# The Python package (crates/jaccl-py) is tested in virtual environments in the target
# directory, with numpy, ml_dtypes (bfloat16), pytest and PyTorch from PyPI: the newest torch
# this package supports, and the oldest (a second environment); with torch, expecttest, which
# torch's own test suite needs (a part of it runs over jaccl: crates/jaccl-py/tests/torch_suite.py),
# and with the newest, torchft and parameterized, which torchft's process group tests need
# (crates/jaccl-py/tests/test_torchft.py runs them over jaccl). PyTorch's PyPI wheel is about
# 3 GB to download and 5-7 GB installed (2-3 minutes each here), so both environments are made
# in the background while the Rust tests run. JACCL_SKIP_TORCH=1 leaves torch out (its tests
# then skip).
torch_newest=2.15.0 torch_oldest=2.10.0
venv="$target/py-venv" venv_oldest="$target/py-venv-torch-$torch_oldest"
# No pip cache: it would keep a second copy of every wheel (torch's are 3 GB).
make_venv() {  # DIR [torch version [more packages]]
  python3 -m venv "$1" && PIP_NO_CACHE_DIR=1 "$1/bin/pip" install -q numpy pytest ml_dtypes ${2:+"torch==$2" expecttest} ${3:-}
}
if [[ -n "${JACCL_SKIP_TORCH:-}" ]]; then
  make_venv "$venv" > "$target/py-venv.log" 2>&1 &
  venv_pid=$!
  venv_oldest=""
else
  make_venv "$venv" "$torch_newest" "torchft==0.2.0 parameterized" > "$target/py-venv.log" 2>&1 &
  venv_pid=$!
  make_venv "$venv_oldest" "$torch_oldest" > "$target/py-venv-oldest.log" 2>&1 &
  venv_oldest_pid=$!
fi

step "cargo test --workspace"
cargo test --workspace "$@"

# Then pip builds the package with maturin (PEP 517), as the README's install does, and its
# tests run real jobs of 1-4 processes, the example under `jaccl launch` (the debug binary
# cargo test just built), and the torch.distributed backend under torchrun; with the oldest
# torch, the backend's tests of every collective and of DDP.
install_package() {  # VENV
  MATURIN_PEP517_ARGS="--locked" "$1/bin/pip" install -q --force-reinstall --no-deps ./crates/jaccl-py
}
python_failed() {  # WHAT LOG
  echo "test.sh: SKIPPED $1: could not make its virtual environment (each takes 5-7 GB of disk):" >&2
  tail -20 "$2" >&2 || true
  df -h "$target" >&2 || true
  [[ -z "${JACCL_REQUIRE_ALL:-}" ]] || exit 1
}
step "the Python package and its tests"
if wait "$venv_pid" && install_package "$venv"; then
  JACCL_BIN="$target/debug/jaccl" "$venv/bin/python" -m pytest -q crates/jaccl-py/tests
else
  python_failed "the Python tests" "$target/py-venv.log"
fi
if [[ -n "$venv_oldest" ]]; then
  step "the torch backend with torch $torch_oldest"
  if wait "$venv_oldest_pid" && install_package "$venv_oldest"; then
    # torch before 2.14 has no backend entry points: its users `import jaccl.torch`.
    JACCL_TORCH_IMPORT=1 "$venv_oldest/bin/python" -m pytest -q crates/jaccl-py/tests/test_torch.py \
      -k "every_collective or ddp or device_mesh"
  else
    python_failed "the tests with torch $torch_oldest" "$target/py-venv-oldest.log"
  fi
fi

# Fuzzing and AddressSanitizer, on the nightly toolchain (the library itself builds on
# stable): every fuzz target for 30 s from its corpus, as many at once as there are cores
# (scripts/fuzz.sh 30: CI's 45-minute budget; scripts/fuzz.sh alone runs 60 s a target, and a
# longer run is scripts/fuzz.sh 3600), and the shared-memory and engine tests under ASan
# (scripts/sanitize.sh).
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  step "fuzzing"
  scripts/fuzz.sh 30
  step "AddressSanitizer"
  scripts/sanitize.sh
else
  echo "test.sh: SKIPPED fuzzing and the sanitizer run: they need the nightly toolchain" >&2
  [[ -z "${JACCL_REQUIRE_ALL:-}" ]] || exit 1
fi

# ../shared/rdma-vm boots a small VM with a Soft-RoCE device (rxe0): cargo builds here, the VM
# runs each test binary (cargo's runner), with JACCL_REQUIRE_RDMA=1 so that a missing device is
# a failure. There: the suites over RDMA (JACCL_TEST_NETS=rdma: the seed's collectives, the
# rooted ones and all-to-all, the error contract), `auto` across two pretend
# hosts (RDMA between them, shared memory inside), link-local GIDs only (a binary of its own:
# it takes eth0's IPv4 address away), every RDMA object released (a binary of its own: it
# counts the whole machine's), a device file, SIGKILL/SIGSTOP of a rank, `jaccl bench` and
# `jaccl doctor`; and the delay-and-loss case, which needs `tc netem` (this kind of
# machine's kernel lacks it; the guest's has it). Tests that are about shared memory or TCP
# alone ran on the host above and are left out here.
if (( EUID == 0 )) && [[ -n "$RDMA_VM" ]]; then
  # The VM sees the host read-only, except what is shared: the checkout (the tests run the
  # `jaccl` binary and write temporary files there) and the target directory.
  shares="--share $PWD"
  [[ $target == "$PWD"/* ]] || shares+=" --share $target"
  in_vm() {
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$RDMA_VM/run.sh --timeout 900 $shares --env-prefix JACCL_ --env-prefix RUST_ --" \
      JACCL_REQUIRE_RDMA=1 "$@"
  }
  step "in the RDMA VM ($RDMA_VM)"
  JACCL_TEST_NETS=rdma in_vm cargo test -p jaccl --test collectives --test rooted_and_all_to_all --test errors \
    --test link_local --test rdma_cleanup "$@" \
    -- --skip shared_memory_sizes --skip different_waiting_policies
  JACCL_TEST_NETS=mixed in_vm cargo test -p jaccl --test collectives "$@" \
    -- transports_are_chosen wrappers_raw_api float_sums
  JACCL_TEST_NETS=rdma,mixed JACCL_SOAK=2000 in_vm cargo test -p jaccl --test soak "$@" -- --nocapture
  JACCL_TEST_NETS=rdma JACCL_REQUIRE_NETEM=1 in_vm cargo test -p jaccl --test processes "$@" \
    -- sigkill stopped operation_timeout device_file delay_and_loss
  in_vm cargo test -p jaccl-cli --test cli "$@" -- rdma
  step "done"
else
  echo "test.sh: SKIPPED the RDMA tests and the delay/loss test in the VM: they need root and" \
    "../shared/rdma-vm (or JACCL_RDMA_VM=DIR); on the host RDMA was checked to be unsupported" \
    "with the reason, and delay/loss ran without netem" >&2
  [[ -z "${JACCL_REQUIRE_ALL:-}" ]] || exit 1
fi
