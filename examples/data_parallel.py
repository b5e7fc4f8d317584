"""Data-parallel training of a small MLP with numpy and jaccl.

    jaccl launch -n 4 -- python examples/data_parallel.py

Every rank builds the same synthetic data set and model, takes its shard of each batch,
computes the gradients of its shard, and averages them with one `all_sum` of all gradients
packed in a buffer (as frameworks do with gradient buckets). All ranks therefore apply the same
update and keep the same weights. At the end each rank trains the same model on the whole batch
in one process and checks that the weights agree.

They agree to float tolerance, not bit for bit: the full-batch gradient sums the samples in one
order (one matrix product over the whole batch), the data-parallel one sums each shard and then
adds the shards' sums; floating-point addition is not associative, so the last bits differ, and
the differences grow slowly over the steps. Between ranks, though, the weights are identical to
the bit, because jaccl gives every rank the same bits of the sum.
"""

import sys

import numpy as np

import jaccl

FEATURES, HIDDEN, SAMPLES, STEPS, LEARNING_RATE = 20, 32, 4096, 200, 0.5


def data():
    """A synthetic binary classification set, the same on every rank (fixed seed)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    true_w = rng.standard_normal(FEATURES).astype(np.float32)
    y = ((x @ true_w + 0.3 * np.sin(3 * x[:, 0])) > 0).astype(np.float32)
    return x, y


def initial_params():
    rng = np.random.default_rng(1)
    return [
        (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        np.zeros(HIDDEN, np.float32),
        (rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN)).astype(np.float32),
        np.zeros(1, np.float32),
    ]


def loss_and_grads(params, x, y, total):
    """Binary cross-entropy summed over `x`'s samples and divided by `total` (the whole batch),
    so that the shards' values add up to the whole batch's; and its gradients."""
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2[0]
    p = 1 / (1 + np.exp(-logits))
    eps = np.float32(1e-7)
    loss = -np.sum(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps)) / total
    d_logits = (p - y) / total
    d_h = np.outer(d_logits, w2) * (1 - h * h)
    grads = [x.T @ d_h, d_h.sum(0), h.T @ d_logits, np.array([d_logits.sum()], np.float32)]
    return np.float32(loss), grads


def train(params, step_grads):
    params = [p.copy() for p in params]
    curve = []
    for _ in range(STEPS):
        loss, grads = step_grads(params)
        for p, g in zip(params, grads):
            p -= LEARNING_RATE * g
        curve.append(float(loss))
    return params, curve


def main():
    g = jaccl.init()
    x, y = data()
    shard = slice(g.rank * SAMPLES // g.size, (g.rank + 1) * SAMPLES // g.size)
    # One buffer for the loss and every gradient: one all_sum per step.
    sizes = [p.size for p in initial_params()]
    bucket = np.empty(1 + sum(sizes), np.float32)

    def data_parallel_step(params):
        loss, grads = loss_and_grads(params, x[shard], y[shard], SAMPLES)
        bucket[0] = loss
        np.concatenate([gr.ravel() for gr in grads], out=bucket[1:])
        g.all_sum(bucket, out=bucket)  # in place: sums of the shards = the whole batch's
        parts = np.split(bucket[1:], np.cumsum(sizes)[:-1])
        return bucket[0], [p.reshape(q.shape) for p, q in zip(parts, grads)]

    params, curve = train(initial_params(), data_parallel_step)
    if g.rank == 0:
        print(f"{g.size} rank(s), {SAMPLES} samples, {STEPS} steps")
        for step in range(0, STEPS, 20):
            print(f"step {step:4d}  loss {curve[step]:.5f}")
        print(f"step {STEPS:4d}  loss {curve[-1]:.5f}")

    # Every rank holds the same bits of the weights...
    flat = np.concatenate([p.ravel() for p in params])
    gathered = g.all_gather(flat)
    same_everywhere = all(np.array_equal(gathered[0].view(np.uint32), r.view(np.uint32)) for r in gathered)
    # ... and they match training on the whole batch in one process, to float tolerance (rank 0
    # checks, and tells the others).
    ok = same_everywhere and curve[-1] < curve[0]
    if g.rank == 0:
        single, single_curve = train(initial_params(), lambda p: loss_and_grads(p, x, y, SAMPLES))
        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(params, single))
        close = all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(params, single))
        ok = ok and close
        print(f"weights identical on every rank: {same_everywhere}")
        print(f"largest difference from single-process training: {worst:.2e} ({'ok' if close else 'TOO LARGE'})")
        print(f"final loss: data-parallel {curve[-1]:.6f}, single process {single_curve[-1]:.6f}")
    failed = g.all_sum(np.array([0 if ok else 1], np.int32))[0]
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
