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

The survivors' weights are identical to the bit (checked with an all-gather at the end): every
one of them took every step with the same sums. Samples are split among the ranks of the
current group, so the batch is the same whatever the number of ranks; only how its sum is
split into shards changes at the shrink.
"""

import argparse
import os
import signal
import sys
import time

import numpy as np

import jaccl
from data_parallel import SAMPLES, STEPS, LEARNING_RATE, data, initial_params, loss_and_grads


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, default=None, help="the rank that kills itself")
    parser.add_argument("--kill-step", type=int, default=STEPS // 4, help="the step it does so at")
    args = parser.parse_args()

    g = jaccl.init()
    me = g.rank  # the rank in the first group, which names this process in the output
    x, y = data()
    params = initial_params()
    sizes = [p.size for p in params]
    bucket = np.empty(1 + sum(sizes), np.float32)
    step, losses = 0, []
    while step < STEPS:
        shard = slice(g.rank * SAMPLES // g.size, (g.rank + 1) * SAMPLES // g.size)
        loss, grads = loss_and_grads(params, x[shard], y[shard], SAMPLES)
        if step == args.kill_step and me == args.kill_rank:
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
    return 0 if same and losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
