"""Fault-tolerant data-parallel training with torchft over jaccl: every replica group (here one
process; under torchrun, several) trains the same model, and torchft's ``Manager`` averages the
gradients of the replica groups in the current quorum over a jaccl process group, which it
forms afresh whenever the quorum changes (a replica lost or back). A replica that dies costs
the others the steps of that quorum change; a replacement started with the same
``REPLICA_GROUP_ID`` heals from a survivor (the model and optimizer state) and trains on.

    torchft_lighthouse --min_replicas 1 --bind 127.0.0.1:29510 --join_timeout_ms 1000 \\
        --heartbeat_timeout_ms 1000 &
    export TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510
    REPLICA_GROUP_ID=0 python examples/torchft_ddp.py &
    REPLICA_GROUP_ID=1 python examples/torchft_ddp.py &    # kill -9 it, start it again

``--pg gloo`` runs torchft's ``ProcessGroupGloo`` instead, for comparison. Each step prints one
line, ``STEP`` and a JSON record (the time, the step, whether it committed, how many replica
groups took part, a checksum of the weights), which benches/torchft_recovery.py reads.

torchft 0.2.0's ``DistributedDataParallel`` fails the survivors when an all-reduce of the
gradients fails (its comm hook asserts that the failed work kept its future: ddp.py, line 76,
with Gloo as with jaccl); ``ResilientDDP`` below returns the bucket as it is instead, and the
Manager does not commit that step.
"""

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

from jaccl.torch.torchft import ProcessGroupJaccl


class ResilientDDP(DistributedDataParallel):
    """torchft's DDP whose comm hook survives a failed all-reduce (see the module's docs)."""

    @staticmethod
    def _comm_hook(state: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        work = state.allreduce(bucket.buffer())
        work.wait()  # on failure: reported to the Manager, which will not commit the step
        done = getattr(work.get_future(), "_fut", None)
        if done is None:
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
        return done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", choices=["jaccl", "gloo"], default="jaccl")
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many committed steps")
    parser.add_argument("--timeout", type=float, default=5.0, help="the process group's timeout (s)")
    args = parser.parse_args()

    replica = int(os.environ.get("REPLICA_GROUP_ID", 0))
    torch.set_num_threads(1)
    # The replica group's own store: torchrun's, or one of this process (a group of one rank).
    if "MASTER_PORT" in os.environ:
        store = None
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        host, port, rank, size = "127.0.0.1", store.port, 0, 1

    timeout = timedelta(seconds=args.timeout)
    pg = ProcessGroupJaccl(timeout=timeout) if args.pg == "jaccl" else ProcessGroupGloo(timeout=timeout)

    torch.manual_seed(0)  # the same initial weights in every replica group
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = optim.AdamW(model.parameters(), lr=1e-3)

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
        replica_id=f"torchft_ddp_{replica}",
        timeout=timedelta(seconds=10),
        store_addr=host,
        store_port=port,
        rank=rank,
        world_size=size,
    )
    ddp = ResilientDDP(manager, model)
    loss_of = nn.CrossEntropyLoss()
    data = torch.Generator().manual_seed(1000 + replica)  # each replica group its own data
    while manager.current_step() < args.steps:
        x, y = torch.randn(32, 64, generator=data), torch.randint(0, 10, (32,), generator=data)
        manager.start_quorum()
        opt.zero_grad()
        loss = loss_of(ddp(x), y)
        loss.backward()
        committed = manager.should_commit()
        if committed:
            opt.step()
        record = {
            "t": time.time(),
            "step": manager.current_step(),
            "committed": committed,
            "participants": manager.num_participants(),
            "loss": round(loss.item(), 5),
            "weights": sum(p.detach().double().sum().item() for p in model.parameters()),
        }
        print("STEP " + json.dumps(record), flush=True)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
