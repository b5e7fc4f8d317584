"""jaccl against gloo through torch.distributed itself, nccl-tests style.

    torchrun --nproc-per-node 4 -m jaccl.torch.bench [--sizes 8,64K,4M,32M] [--reps 3]

Every rank joins the default group over jaccl and a group of the same ranks over gloo, then
times each collective at each size on both, interleaved (the order alternates between
repetitions), the best of `--reps` repetitions of a timed loop of about `--seconds` each, as
the slowest rank saw it. Rank 0 prints one line per (collective, size): the time and bus
bandwidth of each backend and their ratio; at 8 B also jaccl's own Python API on the same
connections (`jaccl.Group` on a numpy array), which shows what torch's dispatch costs per call
(with more ranks than cores, every µs of CPU a call costs on each rank shows several times). `--json FILE`
writes the rows as JSON lines.

Then the step of DistributedDataParallel training over each backend (`--ddp-steps`, 0 to
skip): the model and batch of examples/torch_ddp.py (an MLP of 2.1 M parameters, 256 samples
per rank), one DDP replica per backend, steps with gradient synchronisation and without it
(`no_sync`: every rank computes at once) interleaved between the backends, each step timed
after a barrier as the slowest rank saw it, medians. A step's synchronised time minus its
unsynchronised time is what communication costs it; the last line gives that cost for both
backends and jaccl's as a fraction of gloo's.
"""

import argparse
import json
import time
from typing import Callable, Dict, List

import numpy as np
import torch
import torch.distributed as dist

import jaccl
import jaccl.torch  # noqa: F401 (registers the backend: torch before 2.14 has no entry points)

SIZES = "8,64,512,4K,64K,512K,4M,32M"
OPS = "all_reduce,broadcast,all_gather_into_tensor,reduce_scatter_tensor,all_to_all_single,reduce,gather,scatter"


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if scale > 1 else s) * scale


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factors."""
    return {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather_into_tensor": (n - 1) / n,
        "reduce_scatter_tensor": (n - 1) / n,
        "all_to_all_single": (n - 1) / n,
        "gather": (n - 1) / n,
        "scatter": (n - 1) / n,
    }.get(op, 1.0)


def call(op: str, size: int, group: dist.ProcessGroup, rank: int, n: int) -> Callable[[], None]:
    """One `op` of `size` bytes per rank's buffer (float32) on `group`."""
    count = max(size // 4, 1)
    block = max(count // n, 1)
    x = torch.ones(count)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(x, src=0, group=group)
    if op == "reduce":
        return lambda: dist.reduce(x, dst=0, group=group)
    if op == "all_gather_into_tensor":
        inp, out = torch.ones(block), torch.empty(block * n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if op == "reduce_scatter_tensor":
        inp, out = torch.ones(block * n), torch.empty(block)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if op == "all_to_all_single":
        inp, out = torch.ones(block * n), torch.empty(block * n)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if op == "gather":
        inp = torch.ones(block)
        outs = [torch.empty(block) for _ in range(n)] if rank == 0 else None
        return lambda: dist.gather(inp, outs, dst=0, group=group)
    if op == "scatter":
        out = torch.empty(block)
        ins = [torch.ones(block) for _ in range(n)] if rank == 0 else None
        return lambda: dist.scatter(out, ins, src=0, group=group)
    raise SystemExit(f"unknown op {op}")


def timed(run: Callable[[], None], seconds: float, barrier: Callable[[], None]) -> float:
    """Seconds per call: a warm-up, a probe of 5 calls, then about `seconds` of calls (every
    rank makes the same number of calls: the count is agreed)."""
    run()
    barrier()
    start = time.perf_counter()
    for _ in range(5):
        run()
    per_call = (time.perf_counter() - start) / 5
    iters = torch.tensor([max(3, int(seconds / max(per_call, 1e-7)))], dtype=torch.int64)
    dist.all_reduce(iters, op=dist.ReduceOp.MIN)  # over jaccl: all ranks agree
    barrier()
    start = time.perf_counter()
    for _ in range(int(iters.item())):
        run()
    took = torch.tensor([(time.perf_counter() - start) / int(iters.item())], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.item()


def ddp_step_ms(groups: Dict[str, dist.ProcessGroup], steps: int, rank: int) -> Dict[str, float]:
    """Median step times (ms, slowest rank per step) of DDP over each group, with gradient
    synchronisation (`name`) and without (`name` + "_no_sync"), interleaved."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    features, hidden, outputs, batch = 1024, 1024, 16, 256
    replicas = {}
    for name, g in groups.items():
        torch.manual_seed(0)
        mlp = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, outputs)
        )
        replicas[name] = (DDP(mlp, process_group=g), g)
    optimizers = {name: torch.optim.SGD(ddp.parameters(), lr=0.01) for name, (ddp, _) in replicas.items()}
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, features, generator=gen), torch.randn(batch, outputs, generator=gen)

    def train_step(name: str) -> None:
        ddp, opt = replicas[name][0], optimizers[name]
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    keys = [k for name in groups for k in (name, name + "_no_sync")]
    times = torch.zeros(steps + 2, len(keys), dtype=torch.float64)
    for i in range(steps + 2):  # the first two warm up
        names = list(groups) if i % 2 == 0 else list(reversed(groups))
        for name in names:
            ddp, g = replicas[name]
            for synced in (True, False):
                dist.barrier(group=g)
                start = time.perf_counter()
                if synced:
                    train_step(name)
                else:
                    with ddp.no_sync():
                        train_step(name)
                times[i, keys.index(name if synced else name + "_no_sync")] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    medians = times[2:].median(dim=0).values * 1e3
    return {k: medians[j].item() for j, k in enumerate(keys)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--ddp-steps", type=int, default=30, help="DDP steps timed per backend and mode (0: none)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("jaccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups: Dict[str, dist.ProcessGroup] = {"jaccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    direct = jaccl.Group(dist.group.WORLD._g)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows: List[dict] = []
    if rank == 0:
        print(f"# jaccl.torch.bench: {n} ranks, float32, best of {args.reps}, µs per call (slowest rank); busbw GB/s")
        print(f"# {'op':>22} {'size':>10} {'jaccl':>10} {'busbw':>7} {'gloo':>10} {'busbw':>7} {'gloo/jaccl':>10}")
    for op in args.ops.split(","):
        for size in sizes:
            # What to time, and the barrier before it: each backend through torch, and for the
            # 8-byte all-reduce also jaccl's Python API on a numpy array (its fastest input).
            runs = {name: (call(op, size, g, rank, n), lambda g=g: dist.barrier(group=g)) for name, g in groups.items()}
            if op == "all_reduce" and size <= 8:
                x = np.ones(max(size // 4, 1), np.float32)
                runs["jaccl_python"] = (lambda: direct.all_sum(x, out=x), direct.barrier)
            best = {name: float("inf") for name in runs}
            for rep in range(args.reps):
                order = list(runs) if rep % 2 == 0 else list(reversed(runs))
                for name in order:
                    run, barrier = runs[name]
                    best[name] = min(best[name], timed(run, args.seconds, barrier))
            row = {"op": op, "bytes": size, "ranks": n}
            for name in groups:
                row[f"{name}_us"] = best[name] * 1e6
                row[f"{name}_busbw"] = size / best[name] / 1e9 * bus_factor(op, n)
            if "jaccl_python" in best:
                row["jaccl_python_us"] = best["jaccl_python"] * 1e6
            rows.append(row)
            if rank == 0:
                ratio = row["gloo_us"] / row["jaccl_us"]
                print(
                    f"  {op:>22} {size:>10} {row['jaccl_us']:>10.1f} {row['jaccl_busbw']:>7.3f} "
                    f"{row['gloo_us']:>10.1f} {row['gloo_busbw']:>7.3f} {ratio:>9.2f}x",
                    flush=True,
                )
                if "jaccl_python_us" in row:
                    overhead = row["jaccl_us"] - row["jaccl_python_us"]
                    print(f"# {op} {size} B through jaccl.Group on a numpy array: {row['jaccl_python_us']:.1f} µs (torch adds {overhead:.1f} µs)", flush=True)
    if args.ddp_steps > 0:
        ms = ddp_step_ms(groups, args.ddp_steps, rank)
        comm = {name: ms[name] - ms[name + "_no_sync"] for name in groups}
        row = {"op": "ddp_step", "ranks": n, **{f"{k}_ms": v for k, v in ms.items()}}
        row.update({f"{name}_communication_ms": c for name, c in comm.items()})
        rows.append(row)
        if rank == 0:
            print(f"# DDP step, 2.1 M parameters, 256 samples per rank, median of {args.ddp_steps} (ms):")
            for name in groups:
                print(f"# {name:>6}: {ms[name]:.1f} synchronised, {ms[name + '_no_sync']:.1f} without (no_sync): communication {comm[name]:.1f}")
            print(f"# communication jaccl / gloo: {comm['jaccl'] / comm['gloo']:.2f}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
