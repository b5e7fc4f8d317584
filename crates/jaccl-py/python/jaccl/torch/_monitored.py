"""torch's ``monitored_barrier`` for the torch backend, through a group's store.

A debugging barrier that says which ranks did not come: every rank but 0 checks in under a key
of its own, and rank 0 waits for them up to the timeout, then publishes its verdict, which the
others wait for. No jaccl operation is involved, so the group stays usable after a failure.
Rank 0 enforces the timeout (the others wait up to the group's), so that it is the one that
fails, naming the missing ranks, as Gloo's does; the messages are Gloo's, which torch's tests
and users' scripts match. Keys are deleted once read, so a group made again over the same
store (torch gives it the same prefix) finds none of them. Any store torch offers works: their
waits are `_store.arrived`'s, and a zero timeout (which ``wait`` takes for none) checks
once."""

import datetime
import time
from typing import Any, List

import torch.distributed as dist

from ._store import arrived


def monitored_barrier(
    store: Any,
    rank: int,
    size: int,
    number: int,
    timeout: datetime.timedelta,
    group_timeout: datetime.timedelta,
    wait_all_ranks: bool,
) -> None:
    """The `number`th monitored barrier of a group of `size` ranks over its `store`, on `rank`:
    rank 0 waits up to `timeout` for the others (all of them, with `wait_all_ranks`, else
    until the first missing one), the others up to `group_timeout` for rank 0's verdict."""
    key = f"jaccl/monitored/{number}"
    if rank != 0:
        store.set(f"{key}/{rank}", b"")
        if not arrived(store, f"{key}/verdict", time.monotonic() + group_timeout.total_seconds()):
            _fail_at(rank, f"rank 0 did not end it within {group_timeout}")
        verdict = store.get(f"{key}/verdict").decode()
        if store.add(f"{key}/read", 1) == size - 1:
            store.delete_key(f"{key}/verdict")
            store.delete_key(f"{key}/read")
        if verdict:
            _fail_at(rank, f"rank 0 says: {verdict}")
        return
    ms = int(timeout.total_seconds() * 1000)
    deadline = time.monotonic() + timeout.total_seconds()
    missing: List[int] = []
    passed: List[int] = []
    for q in range(1, size):
        if not wait_all_ranks and deadline <= time.monotonic():
            processed = f"Successfully processed ranks: {_listed(passed)}" if passed else (
                "No ranks successfully processed in monitoredBarrier."
            )
            _give(store, key, f"Rank 0 timed out in monitoredBarrier after {ms} ms. {processed}")
        if arrived(store, f"{key}/{q}", deadline):
            store.delete_key(f"{key}/{q}")
            passed.append(q)
            continue
        missing.append(q)
        if not wait_all_ranks:
            break
    if missing:
        ranks = f"Rank{'s' if wait_all_ranks else ''} {_listed(missing)}"
        _give(
            store,
            key,
            f"[Rank 0]: {ranks} failed to pass monitoredBarrier in {ms} ms (they did not check "
            "in through the group's store)",
        )
    store.set(f"{key}/verdict", b"")


def _give(store: Any, key: str, verdict: str) -> None:
    """Publishes rank 0's failure, for the others, and raises it."""
    store.set(f"{key}/verdict", verdict.encode())
    raise dist.DistBackendError(verdict)


def _fail_at(rank: int, why: str) -> None:
    raise dist.DistBackendError(
        f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting "
        f"for send/recv from rank 0. Please check rank 0 logs for faulty rank. ({why})"
    )


def _listed(ranks: List[int]) -> str:
    return ", ".join(map(str, ranks))
