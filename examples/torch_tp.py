"""Tensor parallelism inside a 2 x 2 DeviceMesh over jaccl: data parallel across the first
dimension, a tensor-parallel MLP across the second.

    torchrun --nproc-per-node 4 examples/torch_tp.py [--steps 5]

The first linear layer is split by columns and the second by rows over the "tp" ranks
(`ColwiseParallel`, `RowwiseParallel`: DTensor all-reduces the partial outputs over jaccl), and
the gradients are averaged over the "dp" ranks. The check: the same MLP trained in one process
on the data of both data-parallel replicas gives the same losses and weights. Prints one JSON
line per rank.
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

WIDTH, HIDDEN, BATCH = 64, 128, 32


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def data(replica: int, steps: int):
    g = torch.Generator().manual_seed(10 + replica)
    return [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)) for _ in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("jaccl")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_local_rank("dp")
    model = parallelize_module(MLP(), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dp_group = mesh.get_group("dp")
    losses = []
    for x, y in data(dp, args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad.to_local(), op=dist.ReduceOp.AVG, group=dp_group)
        opt.step()
        loss = loss.detach()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=dp_group)
        losses.append(loss.item())

    reference = MLP()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    replicas = [data(r, args.steps) for r in range(2)]
    ref_losses = []
    for k in range(args.steps):
        ref_opt.zero_grad()
        loss = sum(nn.functional.mse_loss(reference(x), y) for x, y in (d[k] for d in replicas)) / 2
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.item())
    full = [p.full_tensor() for p in model.parameters()]
    close = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(full, reference.parameters()))
    same = all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, ref_losses))
    print("RESULT " + json.dumps({"rank": dist.get_rank(), "ok": close and same, "losses": losses, "reference": ref_losses}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
