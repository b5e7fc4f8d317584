"""Data-parallel training that survives a lost rank: the model of data_parallel.py, whose loop
catches a lost peer, shrinks the group to the ranks alive and redoes the step.

    jaccl launch --elastic -n 4 -- python examples/elastic_training.py --kill-rank 2 --kill-step 50

`--kill-rank R --kill-step S` makes rank R kill itself (SIGKILL, as the kernel's OOM killer or a
failing machine would) at step S, half-way through computing its gradients. The others' next
`all_sum` raises `jaccl.PeerLost` within milliseconds; each survivor then calls `g.shrink()`,
which agrees with the others on the ranks alive (rank 0 may be the one lost) and forms a new
group of them, renumbered, and redoes the step with the batch split among the survivors.
`jaccl launch --elastic` lets the others go on when a rank dies of a signal, and exits 0 when
they finish.

With `--replace`, a new process takes the lost one's place: after the shrink, the new group's
rank 0 starts this script again with the group's invitation (`JACCL_JOIN`), every survivor
calls `g.grow(1)`, and the newcomer, whose `jaccl.init()` returns the grown group, receives the
weights and the step number by broadcast, then trains with the others.

    jaccl launch --elastic -n 4 -- python examples/elastic_training.py --kill-rank 0 --replace

The survivors' weights are identical to the bit (checked with an all-gather at the end): every
one of them took every step with the same sums. Samples are split among the ranks of the
current group, so the batch is the same whatever the number of ranks; only how its sum is
split into shards changes at the shrink.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import numpy as np

import jaccl
from data_parallel import SAMPLES, STEPS, LEARNING_RATE, data, initial_params, loss_and_grads


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, default=None, help="the rank that kills itself")
    parser.add_argument("--kill-step", type=int, default=STEPS // 4, help="the step it does so at")
    parser.add_argument("--replace", action="store_true", help="start a process in the lost one's place")
    args = parser.parse_args()

    joining = "JACCL_JOIN" in os.environ  # this process replaces a lost one
    g = jaccl.init()
    me = g.job_ranks[g.rank]  # the rank in the job, which names this process in the output
    x, y = data()
    params = initial_params()
    sizes = [p.size for p in params]
    bucket = np.empty(1 + sum(sizes), np.float32)
    step, losses, replacement = 0, [], None
    if joining:
        step = receive_state(g, params)
    while step < STEPS:
        shard = slice(g.rank * SAMPLES // g.size, (g.rank + 1) * SAMPLES // g.size)
        loss, grads = loss_and_grads(params, x[shard], y[shard], SAMPLES)
        if step == args.kill_step and me == args.kill_rank and not joining:
            os.kill(os.getpid(), signal.SIGKILL)
        bucket[0] = loss
        np.concatenate([gr.ravel() for gr in grads], out=bucket[1:])
        try:
            g.all_sum(bucket, out=bucket)
        except (jaccl.PeerLost, jaccl.Revoked) as lost:
            began = time.monotonic()
            old_size = g.size
            try:
                g = g.shrink()  # every survivor calls it; the lost rank is left out
            except jaccl.LeftOut as out:
                # The others went on without this rank (it was stopped for the liveness
                # window, say): nothing is left for it to do.
                print(f"rank {me}: {out}; leaving", flush=True)
                return 0
            if g.rank == 0:
                print(
                    f"step {step}: {lost.__class__.__name__} ({lost}); shrank from {old_size} to "
                    f"{g.size} ranks in {1000 * (time.monotonic() - began):.1f} ms; redoing the step",
                    flush=True,
                )
            if args.replace:
                began = time.monotonic()
                if g.rank == 0:
                    replacement = start_replacement(g.invitation())
                g = g.grow(1)  # every member calls it; the newcomer's init returns it too
                send_state(g, params, step)
                if g.rank == 0:
                    print(
                        f"step {step}: a new process joined as rank {g.size - 1} in "
                        f"{1000 * (time.monotonic() - began):.1f} ms and has the weights",
                        flush=True,
                    )
            continue  # redo the step on the new group
        parts = np.split(bucket[1:], np.cumsum(sizes)[:-1])
        for p, gr in zip(params, parts):
            p -= LEARNING_RATE * gr.reshape(p.shape)
        losses.append(float(bucket[0]))
        step += 1

    flat = np.concatenate([p.ravel() for p in params])
    gathered = g.all_gather(flat)
    same = all(np.array_equal(gathered[0].view(np.uint32), r.view(np.uint32)) for r in gathered)
    if g.rank == 0:
        print(f"{g.size} rank(s) finished {STEPS} steps; loss {losses[0]:.5f} -> {losses[-1]:.5f}")
        print(f"weights identical on every surviving rank: {same}")
    if replacement is not None and replacement.wait() != 0:
        return 1
    learned = joining or losses[-1] < losses[0]
    return 0 if same and learned else 1


def start_replacement(invitation: str) -> subprocess.Popen:
    """This script again, as a new process that joins the group with `invitation` (its output
    goes where this one's does)."""
    env = dict(os.environ, JACCL_JOIN=invitation)
    return subprocess.Popen([sys.executable] + sys.argv, env=env)


def send_state(g: "jaccl.Group", params: list, step: int) -> None:
    """Rank 0's weights and step, broadcast to every rank of the grown group (the newcomer
    calls `receive_state`)."""
    state = np.concatenate([p.ravel() for p in params] + [np.array([step], np.float32)])
    g.broadcast(state, 0, out=state)


def receive_state(g: "jaccl.Group", params: list) -> int:
    """The newcomer's side of `send_state`: the weights, in place, and the step."""
    state = np.empty(1 + sum(p.size for p in params), np.float32)
    g.broadcast(state, 0, out=state)
    offset = 0
    for p in params:
        p[...] = state[offset : offset + p.size].reshape(p.shape)
        offset += p.size
    return int(state[-1])


if __name__ == "__main__":
    sys.exit(main())
