"""How fast torchft training goes on after a replica group dies, and takes a replacement back,
over jaccl and over torchft's own ProcessGroupGloo: the same script (examples/torchft_ddp.py),
the same lighthouse settings, trials of the two alternating in the same minutes.

    python benches/torchft_recovery.py --trials 5 --replicas 2 --heartbeat-timeout-ms 1000

Each trial starts a lighthouse and `--replicas` replica groups (one process each), waits until
all train together, SIGKILLs one at random, and measures (wall clock, from the kill) the
survivors' first step committed without it; then starts a replacement with the lost one's
`REPLICA_GROUP_ID` and measures its first committed step (healed from a survivor) and the
survivors' first step with every replica group again; then checks that every replica group's
weights agree at a step all committed. Prints a table per process group, and writes every
figure as JSON with `--json PATH`. `--pgs jaccl` runs one of them (the tests do, once).
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchft_ddp.py"


class Replica:
    """One replica group's process, and the STEP records it printed."""

    def __init__(self, group: int, env: dict, pg: str) -> None:
        self.group, self.env, self.pg = group, env, pg
        self.steps: list = []
        self.other: list = []
        self.proc = None

    def start(self) -> None:
        self.steps, self.other = [], []
        env = dict(self.env, REPLICA_GROUP_ID=str(self.group))
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--pg", self.pg],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # (in this script's session: killing the session kills them too)
        threading.Thread(target=self._read, args=(self.proc, self.steps, self.other), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen, steps: list, other: list) -> None:
        for line in proc.stdout:
            if line.startswith("STEP "):
                steps.append(json.loads(line[5:]))
            else:
                other.append(line.rstrip())

    def first(self, after: float, participants: int) -> "dict | None":
        """The first step committed after `after` with `participants` replica groups."""
        return next((s for s in list(self.steps) if s["t"] > after and s["committed"]
                     and s["participants"] == participants), None)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_for(what: str, check, replicas: list, limit: float = 120.0):
    """`check()` once it is truthy; fails if `limit` passes or a replica that should live died."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        for r in replicas:
            if r.proc.poll() is not None:
                raise RuntimeError(f"replica group {r.group} ended ({r.proc.returncode}) while "
                                   f"waiting for {what}: " + " | ".join(r.other[-5:]))
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(pg: str, replicas: int, heartbeat_ms: int, rng: random.Random) -> dict:
    """One kill and replacement (see the module's docs); the figures in seconds."""
    port = free_port()
    lighthouse = subprocess.Popen(
        [shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse"),
         "--min_replicas", "1", "--bind", f"127.0.0.1:{port}", "--quorum_tick_ms", "50",
         "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", str(heartbeat_ms)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") and not k.startswith("JACCL_")}
    env.update(TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}", OMP_NUM_THREADS="1")
    groups = [Replica(g, env, pg) for g in range(replicas)]
    try:
        for r in groups:
            r.start()
        began = time.time()
        wait_for("every replica group training", lambda: all(r.first(began, replicas) for r in groups), groups)
        time.sleep(1.0)
        victim = groups[rng.randrange(replicas)]
        survivors = [r for r in groups if r is not victim]
        killed = time.time()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        went_on = wait_for("the survivors' step without it",
                           lambda: [r.first(killed, replicas - 1) for r in survivors]
                           if all(r.first(killed, replicas - 1) for r in survivors) else None, survivors)
        restarted = time.time()
        victim.start()
        healed = wait_for("the replacement's first step",
                          lambda: victim.first(restarted, replicas), groups)
        together = wait_for("every replica group again",
                            lambda: [r.first(restarted, replicas) for r in survivors]
                            if all(r.first(restarted, replicas) for r in survivors) else None, groups)
        time.sleep(1.0)
        committed = [{s["step"]: s["weights"] for s in list(r.steps) if s["committed"]} for r in groups]
        common = max(set(committed[0]).intersection(*committed[1:]), default=None)
        return {
            "pg": pg,
            "victim": victim.group,
            "kill_to_survivors_step": max(s["t"] for s in went_on) - killed,
            "restart_to_replacement_step": healed["t"] - restarted,
            "restart_to_all_together": max(s["t"] for s in together) - restarted,
            "healed": any("healing" in line for line in victim.other),
            "weights_agree": common is not None and len({c[common] for c in committed}) == 1,
            "common_step": common,
        }
    finally:
        for r in groups:
            r.stop()
        lighthouse.kill()
        lighthouse.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    parser.add_argument("--pgs", default="jaccl,gloo", help="process groups, alternating")
    parser.add_argument("--json", help="write every trial's figures here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = []
    for n in range(args.trials):
        for pg in args.pgs.split(","):
            got = trial(pg, args.replicas, args.heartbeat_timeout_ms, rng)
            print(f"trial {n} {pg}: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in got.items() if k != "pg"),
                flush=True)
            results.append(got)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"\n{args.replicas} replica groups, lighthouse heartbeat timeout {args.heartbeat_timeout_ms} ms; "
          "seconds, median [min-max] of the trials")
    print("| process group | kill -> survivors' step without it | restart -> replacement's step | "
          "restart -> all together | weights agree |")
    print("|---|---|---|---|---|")
    for pg in args.pgs.split(","):
        mine = [r for r in results if r["pg"] == pg]

        def cell(key: str) -> str:
            v = [r[key] for r in mine]
            return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"

        agree = sum(r["weights_agree"] for r in mine)
        print(f"| {pg} | {cell('kill_to_survivors_step')} | {cell('restart_to_replacement_step')} | "
              f"{cell('restart_to_all_together')} | {agree}/{len(mine)} |")
    return 0 if all(r["weights_agree"] and r["healed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
