"""Data-parallel training with PyTorch's DistributedDataParallel over jaccl (or gloo).

    torchrun --nproc-per-node 4 examples/torch_ddp.py [--backend jaccl|gloo] [--steps 50]

An MLP of about 2.1 M parameters learns a synthetic regression, 256 samples per rank and step.
The only jaccl-specific thing is the backend's name: torch finds jaccl through the package's
entry point (torch 2.14 and later; with 2.10 to 2.13, `import jaccl.torch`, which this file does).

Each rank prints one JSON line: the loss of every step (averaged over the ranks), a digest of
the final weights (the same on every rank: DDP keeps them identical), and the step time with
gradient synchronisation and without it (DDP's `no_sync`: every rank computes at once, nothing
is sent), whose difference is what the communication costs the step.
"""

import argparse
import hashlib
import json
import time

import torch
import torch.distributed as dist

try:  # torch before 2.14 finds the "jaccl" backend only this way; later ones by its name
    import jaccl.torch  # noqa: F401
except ImportError:  # without jaccl (the gloo runs)
    pass
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

FEATURES, HIDDEN, OUTPUTS, BATCH = 1024, 1024, 16, 256


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, OUTPUTS),
    )


def batches(rank: int, steps: int):
    """This rank's data: a fixed random linear target with noise (seeded by rank)."""
    g = torch.Generator().manual_seed(1000 + rank)
    target = torch.randn(FEATURES, OUTPUTS, generator=torch.Generator().manual_seed(7)) / FEATURES**0.5
    for _ in range(steps):
        x = torch.randn(BATCH, FEATURES, generator=g)
        yield x, x @ target + 0.01 * torch.randn(BATCH, OUTPUTS, generator=g)


def step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="jaccl")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--timed", type=int, default=20, help="steps timed with and without sync")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model())  # broadcasts rank 0's weights
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    losses = []
    for x, y in batches(rank, args.steps):
        loss = step(ddp, opt, x, y)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    weights = hashlib.sha256()
    for p in ddp.parameters():
        weights.update(p.detach().numpy().tobytes())

    # Step time with DDP's gradient all-reduce and without (no_sync), interleaved, medians.
    data = list(batches(rank + size, 2))
    synced, unsynced = [], []
    for _ in range(args.timed):
        for times, sync in ((synced, True), (unsynced, False)):
            dist.barrier()
            start = time.perf_counter()
            if sync:
                step(ddp, opt, *data[0])
            else:
                with ddp.no_sync():
                    step(ddp, opt, *data[0])
            times.append(time.perf_counter() - start)
    # The slowest rank's median, in ms.
    med = lambda v: sorted(v)[len(v) // 2] * 1e3  # noqa: E731
    times = torch.tensor([med(synced), med(unsynced)], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    print(
        "RESULT "
        + json.dumps(
            {
                "backend": args.backend,
                "rank": rank,
                "losses": losses,
                "weights": weights.hexdigest(),
                "step_ms": round(times[0].item(), 3),
                "step_ms_without_sync": round(times[1].item(), 3),
                "parameters": sum(p.numel() for p in ddp.parameters()),
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
