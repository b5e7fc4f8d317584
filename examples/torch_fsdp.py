"""Fully sharded data parallel training (FSDP2's `fully_shard`) over jaccl.

    torchrun --nproc-per-node 2 examples/torch_fsdp.py [--steps 10]

Each layer's parameters are sharded over the ranks: FSDP all-gathers them before each
layer's forward and backward and reduce-scatters the gradients (jaccl's all-gather and
reduce-scatter, started asynchronously so that the next layer's parameters arrive while this
one computes). The check: the same model trained in one process on every rank's data gives
the same losses and weights, to float tolerance. Prints one JSON line per rank.
"""

import argparse
import json

import torch
import torch.distributed as dist

try:  # torch before 2.14 finds the "jaccl" backend only this way; later ones by its name
    import jaccl.torch  # noqa: F401
except ImportError:  # without jaccl (the gloo runs)
    pass
from torch import nn

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch before 2.6
    from torch.distributed._composable.fsdp import fully_shard

WIDTH, BATCH = 256, 64


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))


def data(rank: int, steps: int):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("jaccl")
    rank, size = dist.get_rank(), dist.get_world_size()

    sharded = model()
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
    losses = []
    for x, y in data(rank, args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(sharded(x), y)
        loss.backward()
        opt.step()
        dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
        losses.append(loss.item())

    # The reference: one process, the whole batch of every rank (the mean of their losses).
    reference = model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    everyone = [data(r, args.steps) for r in range(size)]
    ref_losses = []
    for k in range(args.steps):
        ref_opt.zero_grad()
        loss = sum(nn.functional.mse_loss(reference(x), y) for x, y in (d[k] for d in everyone)) / size
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.item())
    full = [p.full_tensor() for p in sharded.parameters()]
    close = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(full, reference.parameters()))
    same_losses = all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, ref_losses))
    print("RESULT " + json.dumps({"rank": rank, "ok": close and same_losses, "losses": losses, "reference": ref_losses}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
