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
if (( ${#need[@]} )) && (( EUID == 0 )) && command -v apt-get >/dev/null; then
  echo "test.sh: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

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

cargo test --workspace "$@"

# The delay-and-loss case needs `tc netem`, which this kind of machine's kernel lacks and the
# guest kernel of ../shared/rdma-vm has: run that test again inside the VM (cargo builds here,
# the VM runs the binary), where missing netem is a failure.
RDMA_VM=""
for dir in "${JACCL_RDMA_VM:-}" ../shared/rdma-vm /work/shared/rdma-vm; do
  if [[ -n "$dir" && -x "$dir/setup.sh" ]]; then RDMA_VM=$(cd "$dir" && pwd); break; fi
done
if (( EUID == 0 )) && [[ -n "$RDMA_VM" ]]; then
  "$RDMA_VM/setup.sh" >/dev/null
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$RDMA_VM/run.sh --timeout 600 --env JACCL_REQUIRE_NETEM=1 --" \
    cargo test -p jaccl --test processes "$@" delay_and_loss
else
  echo "test.sh: SKIPPED the delay/loss test in the VM: it needs root and ../shared/rdma-vm" \
    "(or JACCL_RDMA_VM=DIR); on the host it ran without netem" >&2
fi
