"""jaccl as a ``torch.distributed`` backend: ``init_process_group("jaccl")``.

PyTorch finds it by itself from torch 2.14 on (the ``torch.distributed.backends`` entry point
of this package); with older versions, ``import jaccl.torch`` first. Then every
``torch.distributed`` call on CPU tensors, ``DistributedDataParallel``, FSDP, ``new_group``,
``DeviceMesh`` and the functional collectives run over jaccl::

    import torch.distributed as dist
    dist.init_process_group("jaccl")          # under torchrun, or with init_method / store
    dist.all_reduce(tensor)

Start-up goes through the store torch gives each group: its rank 0 publishes the address of
its coordinator there (under the group's own prefix and the job's id, see `_start_job`), and
the job secret goes from rank 0 to each rank in a box sealed to that rank's key, so that the
store never holds it; a ``JACCL_JOB_TOKEN`` (or ``_FILE``) the user set is used instead.
torch's ``timeout`` is both the start-up and the operation timeout. A group that
``new_group`` makes is a jaccl sub-group of the default one (``jaccl.Group`` formed by its
members alone), with its own connections and timeout. Errors are raised as
``torch.distributed.DistBackendError`` whose cause is the jaccl exception (``PeerLost``,
``Timeout``...), which names the rank and its peer.
"""

import collections
import datetime
import hashlib
import json
import math
import os
import queue
import secrets
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from .. import _native, errors
from . import _monitored, _sparse

__all__ = ["ProcessGroupJaccl", "register"]

# torch's base class of a Python-made Work (renamed over the versions).
_WorkBase = getattr(dist, "_Work", None) or torch._C._distributed_c10d.Work

# jaccl's element type of each torch dtype.
_DTYPES = {
    torch.bool: "bool",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _name
# How operations that only move data (all but the reductions) carry a type jaccl lacks (torch's
# float8s, which FSDP2 all-gathers with float8 training): as unsigned integers of its size.
_MOVED_AS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}

_R = dist.ReduceOp.RedOpType if hasattr(dist.ReduceOp, "RedOpType") else dist.ReduceOp
# jaccl's reduction of each torch one, by the enum's value (PREMUL_SUM: the input scaled, then
# summed). Keyed by value: hashing torch's enum costs more than an 8-byte all-reduce's Python.
_OPS = {
    int(_R.SUM): "sum",
    int(_R.AVG): "avg",
    int(_R.PRODUCT): "prod",
    int(_R.MIN): "min",
    int(_R.MAX): "max",
    int(_R.BAND): "band",
    int(_R.BOR): "bor",
    int(_R.BXOR): "bxor",
}
_PREMUL_SUM = getattr(_R, "PREMUL_SUM", None)

def register() -> None:
    """Registers the ``"jaccl"`` backend with ``torch.distributed`` (for CPU tensors). Called on
    ``import jaccl.torch``, and by torch itself through the package's entry point."""
    if "JACCL" in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend("jaccl", _create, extended_api=True, devices=["cpu"])


def _create(opts: Any, _backend_options: Any = None) -> "ProcessGroupJaccl":
    """torch's creator of a group: the default one is a jaccl job started through the store;
    the others, when the default group is jaccl's, sub-groups of it (formed by their members
    alone, as torch calls this only there), else jobs of their own."""
    rank, size = opts.group_rank, opts.group_size
    timeout = opts.timeout
    members = list(getattr(opts, "global_ranks_in_group", []) or [])
    name = str(getattr(opts, "group_id", "") or "")
    world = dist.group.WORLD if members else None
    if isinstance(world, ProcessGroupJaccl):
        g = _raising(lambda: world._g.subgroup_of_members(members, name, _at_least_1ms(timeout)))
    else:
        g = _start_job(opts.store, rank, size, timeout, name)
    return ProcessGroupJaccl(g, rank, size, timeout, opts.store)


# The jaccl jobs this process started, per torch group name: a part of each job's id.
_jobs_started: Dict[str, int] = collections.Counter()
_jobs_lock = threading.Lock()

# What identifies the launcher's job, in a jaccl job's id (with JACCL_JOB_ID, the user's).
_IDENTITY = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "JACCL_JOB_ID")


def _start_job(store: Any, rank: int, size: int, timeout: datetime.timedelta, group: str) -> "_native.Group":
    """The jaccl job of `size` ranks that torch's group `group` is, started through `store`
    (already prefixed per group by torch), where rank 0 publishes its coordinator's address.

    The store's keys carry the job's id, which every rank computes alone and alike: the
    launcher's identity, the size, and how many jobs this process started for this group name
    before (every rank makes the same sequence of groups; torch gives a group made again after
    `destroy_process_group` the same prefix). Rank 0 claims the id as its root, the others as
    its members: more claims than that mean that another job with the same identity shares
    this store (or left its keys in it), which fails at once rather than pair ranks of two jobs.

    The secret: a user's ``JACCL_JOB_TOKEN``/``_FILE`` as it is; else rank 0 draws 256 bits and
    seals them to each rank's ephemeral public key (`_native.SealKey`), so a reader of the store
    learns nothing. The secret goes to jaccl in `init`'s settings, never into the environment."""
    with _jobs_lock:
        _jobs_started[group] += 1
        made = _jobs_started[group]
    identity = [os.environ.get(v, "") for v in _IDENTITY] + [size, group, made]
    job = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    keys = f"jaccl/{job}/"
    deadline = time.monotonic() + timeout.total_seconds()
    _claim(store, keys, rank, size, add=1)
    if rank == 0:
        store.set(keys + "coordinator", f"{_reachable_address(store)}:{_free_port()}")
    seconds = _seconds(timeout)
    settings = {
        "JACCL_RANK": str(rank),
        "JACCL_SIZE": str(size),
        "JACCL_TIMEOUT": seconds,
        "JACCL_STARTUP_TIMEOUT": seconds,
    }
    given = any(os.environ.get(v, "").strip() for v in ("JACCL_JOB_TOKEN", "JACCL_JOB_TOKEN_FILE"))
    _agree_on_token(store, keys, rank, size, given, deadline)
    if not given:
        settings["JACCL_JOB_TOKEN"] = _sealed_secret(store, keys, rank, size, deadline)
    coordinator = _await(store, keys + "coordinator", rank, deadline, "rank 0's address")
    settings["JACCL_COORDINATOR"] = coordinator.decode()
    g = _raising(lambda: _native.init(settings))
    # A job that claimed the id while this one started (the ranks of two jobs arriving
    # interleaved) is found here, by every rank that formed the group.
    try:
        _claim(store, keys, rank, size, add=0)
    except BaseException:
        g.close()
        raise
    return g


def _claim(store: Any, keys: str, rank: int, size: int, add: int) -> None:
    """Claims the job's id for `rank` (`add=1`), or checks that nobody claimed too much
    (`add=0`): one root, `size - 1` members."""
    roots = store.add(keys + "roots", add if rank == 0 else 0)
    members = store.add(keys + "members", add if rank != 0 else 0)
    if roots > 1 or members > size - 1:
        raise _start_up_error(
            rank,
            f"another job with this one's identity ({', '.join(_IDENTITY)}, the group size) "
            f"started in the same store ({roots} rank 0s and {members} other ranks for {size} "
            "ranks), or a failed one left its keys there: give each job its own JACCL_JOB_ID, "
            "or a fresh store (a new file for file://)",
        )


def _agree_on_token(store: Any, keys: str, rank: int, size: int, given: bool, deadline: float) -> None:
    """Checks that this rank and rank 0 (rank 0: every rank) agree on whether the user gave
    the job's token, before any of them waits for a secret the other way would bring."""
    mine = "given" if given else "sealed"
    store.set(f"{keys}token/{rank}", mine)
    for q in range(1, size) if rank == 0 else [0]:
        theirs = _await(store, f"{keys}token/{q}", rank, deadline, f"rank {q}'s start").decode()
        if theirs != mine:
            has, lacks = (q, rank) if theirs == "given" else (rank, q)
            raise _start_up_error(
                rank,
                f"rank {has} was given a JACCL_JOB_TOKEN or JACCL_JOB_TOKEN_FILE and rank {lacks} "
                "was not: give every rank the same token, or none",
            )


def _await(store: Any, key: str, rank: int, deadline: float, what: str) -> bytes:
    """The value of `key` once a rank sets it, waiting until `deadline` (`time.monotonic()`)."""
    left = min(max(deadline - time.monotonic(), 0.001), 1e9)
    try:
        store.wait([key], datetime.timedelta(seconds=left))
    except RuntimeError as e:  # DistStoreError; a file store's plain RuntimeError
        raise _start_up_error(rank, f"timed out waiting for {what} ({type(e).__name__}: {e})") from None
    return store.get(key)


def _sealed_secret(store: Any, keys: str, rank: int, size: int, deadline: float) -> str:
    """The job secret, which rank 0 draws and passes to each rank in a box sealed to the
    public key that rank published (a reader of the store cannot open it)."""
    if rank == 0:
        secret = secrets.token_hex(32)
        for q in range(1, size):
            public = _await(store, f"{keys}key/{q}", rank, deadline, f"rank {q}'s public key")
            try:
                sealed = _native.seal(public, secret.encode())
            except errors.Error:
                raise _tampered(rank, f"rank {q}'s public key is not one") from None
            store.set(f"{keys}sealed/{q}", sealed)
        return secret
    key = _native.SealKey()
    store.set(f"{keys}key/{rank}", key.public)
    secret = key.open(_await(store, f"{keys}sealed/{rank}", rank, deadline, "the secret from rank 0"))
    if secret is None:
        raise _tampered(rank, "the job secret sealed for this rank does not open with its key")
    return secret.decode()


def _tampered(rank: int, what: str) -> BaseException:
    return _start_up_error(
        rank, f"{what}: someone other than this job's ranks wrote the store during start-up"
    )


def _start_up_error(rank: int, why: str) -> BaseException:
    e = errors.BootstrapError(f"rank {rank}: init: start-up through torch's store: {why}")
    e.rank, e.op = rank, "init"
    return _torch_error(e)


def _seconds(timeout: datetime.timedelta) -> str:
    """torch's timeout as jaccl reads one (seconds; at least a millisecond)."""
    return repr(_at_least_1ms(timeout))


def _at_least_1ms(timeout: datetime.timedelta) -> float:
    """torch's timeout in seconds, at least a millisecond (jaccl has no zero timeout)."""
    return max(timeout.total_seconds(), 0.001)


def _reachable_address(store: Any) -> str:
    """The address the other ranks can reach this one at: the interface towards the store's
    host (a TCP store), else what this host's name resolves to; `JACCL_COORDINATOR`'s host if
    it is set."""
    configured = os.environ.get("JACCL_COORDINATOR", "")
    if configured:
        return configured.rsplit(":", 1)[0]
    base = store
    while hasattr(base, "underlying_store"):
        base = base.underlying_store
    host = getattr(base, "host", None)
    if host:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, getattr(base, "port", 1) or 1))
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _raising(call: Callable[[], Any]) -> Any:
    """Runs `call`, raising its jaccl error as torch's ``DistBackendError`` (the jaccl
    exception as its cause)."""
    try:
        return call()
    except errors.Error as e:
        raise _torch_error(e) from e


def _torch_error(e: BaseException) -> BaseException:
    if isinstance(e, errors.InvalidArgument):
        return ValueError(str(e))
    if isinstance(e, errors.Error):
        made = dist.DistBackendError(str(e))
        made.__cause__ = e
        return made
    return e


def _reduction(op: Any) -> tuple:
    """jaccl's name of torch's reduction `op`, and PREMUL_SUM's factor (else None)."""
    kind = getattr(op, "op", op)
    if _PREMUL_SUM is not None and kind == _PREMUL_SUM:
        # The factor: an attribute in newer torch versions, before that only in its state.
        factor = getattr(op, "factor", None)
        if factor is None:
            factor = op.__getstate__()[1]
        return "sum", factor
    try:
        name = _OPS.get(int(kind))
    except (TypeError, ValueError):
        name = None
    if name is None:
        raise ValueError(f"jaccl: unsupported reduction {op}")
    return name, None


class _Tensor:
    """A tensor as jaccl reads or writes it: its memory, contiguous (a copy when it is not,
    copied back with :meth:`finish` where the call writes it)."""

    __slots__ = ("tensor", "buffer", "dtype")

    def __init__(
        self, tensor: torch.Tensor, apart_from: Optional["_Tensor"] = None, reduced: bool = False
    ) -> None:
        """`apart_from`: the output of the call that reads `tensor`, which it may not share
        memory with (FSDP all-gathers a shard that lies inside the output): then a copy.
        `reduced`: whether the call computes with the elements (else it only moves them)."""
        if tensor.device.type != "cpu":
            raise ValueError(f"jaccl: tensors must be on the CPU, not {tensor.device}")
        if tensor.layout != torch.strided:
            raise ValueError(
                f"jaccl: tensors must be dense, not {tensor.layout} (as with Gloo, only all_reduce "
                "takes sparse COO tensors, and sums them)"
            )
        dtype = _jaccl_dtype(tensor, reduced)
        self.tensor = tensor
        self.buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
        self.dtype = dtype
        if apart_from is not None and _overlap(self.memory, apart_from.memory):
            self.buffer = self.buffer.clone()

    @property
    def memory(self) -> tuple:
        b = self.buffer
        return (b.data_ptr(), b.numel() * b.element_size())

    def finish(self) -> None:
        if self.buffer is not self.tensor:
            self.tensor.copy_(self.buffer)


def _jaccl_dtype(tensor: torch.Tensor, reduced: bool) -> str:
    """jaccl's element type for `tensor`'s, in a call that computes with the elements
    (`reduced`) or only moves them (then any type, as unsigned integers of its size)."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None and not reduced:
        dtype = _MOVED_AS.get(tensor.element_size())
    if dtype is None:
        what = "reduced" if reduced else "moved"
        raise ValueError(f"jaccl: element type {tensor.dtype} cannot be {what} by jaccl")
    return dtype


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two `(address, length)` ranges share a byte."""
    return a[1] > 0 and b[1] > 0 and a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


class _Staging:
    """The contiguous buffers that list-taking operations stage their tensors in (scatter's and
    all-to-all's inputs, gather's and all-gather's outputs, the root's copy of reduce's input),
    kept for the next call of the same type and length: a fresh large tensor costs a page fault
    and zeroed page per 4 KiB (concatenating four 8 MiB tensors took 13 ms into a new tensor and
    2.4 ms into a kept one here). At most `KEPT` buffers and `KEPT_BYTES` stay, the least
    recently used go first; an operation that finds its buffer taken by one still running
    makes another."""

    KEPT = 8
    KEPT_BYTES = 256 << 20

    def __init__(self) -> None:
        self._free: "collections.OrderedDict[tuple, torch.Tensor]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def take(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A 1-D tensor of `like`'s type and `numel` elements, its contents undefined."""
        with self._lock:
            kept = self._free.pop((like.dtype, numel), None)
        return kept if kept is not None else like.new_empty(numel)

    def flat(self, tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """The tensors one after the other in a staged 1-D tensor."""
        buf = self.take(like, sum(t.numel() for t in tensors))
        if tensors:
            torch.cat([t.reshape(-1) for t in tensors], out=buf)
        return buf

    def give(self, tensors: Sequence[torch.Tensor]) -> None:
        """Keeps `tensors` (taken before, their operation done) for the next calls."""
        with self._lock:
            for t in tensors:
                self._free[(t.dtype, t.numel())] = t
                self._free.move_to_end((t.dtype, t.numel()))
            total = sum(t.numel() * t.element_size() for t in self._free.values())
            while self._free and (len(self._free) > self.KEPT or total > self.KEPT_BYTES):
                _, old = self._free.popitem(last=False)
                total -= old.numel() * old.element_size()


def _unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copies `flat` back into `tensors`, one after the other."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class _Work(_WorkBase):
    """torch's handle of an operation: the jaccl operations it started (none if it ran at
    once), then what to do once they are done (copies out of staging buffers), which whoever
    first sees them done runs, once: `wait`, or a poll (`is_completed`, `exception`), so that
    an operation reported complete has written every output its caller reads."""

    def __init__(
        self,
        pending: Optional[List[Any]],
        result: Any,
        finish: Optional[Callable[[], None]] = None,
        guard: Sequence[tuple] = (),
        completer: Optional["_Completer"] = None,
        p2p: bool = False,
        sender: Optional[list] = None,
    ) -> None:
        """`pending`: the jaccl operations (`p2p`: to come, through `_P2P.submit`); `guard`:
        `(tensor, data_ptr)` of the tensors they use (see `_guarded`); `completer`: the
        group's, for `get_future`; `sender`: for a receive from any source, where its first
        piece's jaccl operation goes (which knows the sender once it has received)."""
        super().__init__()
        self._pending = pending or []
        self._result = result
        self._finish = finish
        self._guard = guard
        self._error: Optional[BaseException] = None
        # Pieces of point-to-point messages not handed to jaccl yet, and the group's `_P2P`
        # that holds them (see `_P2P`).
        self._held = 0
        self._p2p: Optional["_P2P"] = None
        self._completer = completer
        self._sender = sender
        self._done = not pending and not p2p
        self._lock = threading.Lock()

    def _settle(self, block: bool, deadline: Optional[float] = None) -> bool:
        """Whether the operation is done, finishing it if its jaccl operations have ended
        (waiting for them if `block`, the GIL released, until `deadline` on
        `time.monotonic()`'s clock if given). Held pieces are handed to jaccl by a wait, or
        by a poll on the thread that submitted them (`_P2P.flush`)."""
        if self._done:
            return True
        p2p = self._p2p
        if p2p is not None and self._held:
            if not (block or p2p.submitted_here()):
                return False
            p2p.flush()
        if not self._lock.acquire(blocking=block, timeout=_left(deadline) if block else -1):
            return False  # another thread is finishing it
        try:
            if self._done:
                return True
            if not block and not all(w.is_completed() for w in self._pending):
                return False
            if deadline is not None and not all(_ended(w, deadline) for w in self._pending):
                return False
            try:
                for w in self._pending:
                    w.wait(None)
                _check_guard(self._guard)
                if self._finish is not None:
                    self._finish()
            except BaseException as e:
                self._error = _torch_error(e)
            self._end()
            return True
        finally:
            self._lock.release()

    def _fail(self, error: BaseException) -> None:
        """Ends the operation with `error` (a held one whose group stopped)."""
        with self._lock:
            if not self._done:
                self._error = _torch_error(error)
                self._end()

    def _end(self) -> None:
        self._done = True
        self._pending, self._finish, self._guard, self._p2p = [], None, (), None

    def wait(self, timeout: Any = None) -> bool:
        """Waits for the operation to end, and raises its error if it failed. With a
        `timeout` (torch's default, zero, means none), an operation not done by then raises
        RuntimeError, as Gloo's does, and goes on (a later wait can still finish it)."""
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout or 0
        deadline = time.monotonic() + seconds if seconds > 0 else None
        if not self._settle(True, deadline):
            raise RuntimeError(
                f"jaccl: Operation timed out! It did not end within the {seconds} s that "
                "Work.wait was given; it goes on, and a later wait can still finish it"
            )
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._settle(False)

    def is_success(self) -> bool:
        return self._settle(False) and self._error is None

    def exception(self) -> Optional[BaseException]:
        self._settle(False)
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        """The sender of a receive from any source (``irecv`` without ``src``) once it has
        received, else -1 (as Gloo's)."""
        if self._sender is None:
            raise RuntimeError("jaccl: source_rank is for a receive from any source (recv without src)")
        source = self._sender[0].source if self._sender else None
        return -1 if source is None else source

    _source_rank = source_rank

    def get_future(self) -> "torch.futures.Future":
        """A future that the group's completer thread completes. Held pieces are handed to
        jaccl here, on the caller's thread (the completer never starts any)."""
        future: torch.futures.Future = torch.futures.Future()
        p2p = self._p2p
        if p2p is not None and self._held:
            p2p.flush()
        if self._done or self._completer is None:
            _complete_future(future, self)
        else:
            self._completer.put(future, self)
        return future


def _left(deadline: Optional[float]) -> float:
    """Seconds until `deadline` (at least 0), or -1 (no limit, as `Lock.acquire` takes it)."""
    return -1 if deadline is None else max(0.0, deadline - time.monotonic())


def _ended(work: Any, deadline: float) -> bool:
    """Whether jaccl's `work` ended (well or not) by `deadline`, waiting until then."""
    try:
        return work.wait(_left(deadline))
    except Exception:
        return True  # it failed: the caller's wait raises its error


def _complete_future(future: "torch.futures.Future", work: _Work) -> None:
    try:
        work.wait()
        future.set_result(work._result)
    except BaseException as e:
        future.set_exception(e)


class _Completer:
    """A thread that completes the futures of a group's operations (`_Work.get_future`) in
    order, as the operations end, so that jaccl's progress thread never waits for the GIL.
    Started with the first future; ended when the group stops (or is collected)."""

    def __init__(self) -> None:
        self._queue: Optional["queue.Queue"] = None
        self._lock = threading.Lock()

    def put(self, future: "torch.futures.Future", work: _Work) -> None:
        with self._lock:
            if self._queue is None:
                self._queue = queue.Queue()
                thread = threading.Thread(
                    target=_complete_futures, args=(self._queue,), name="jaccl-futures", daemon=True
                )
                thread.start()
            self._queue.put((future, work))

    def stop(self) -> None:
        """Ends the thread once the futures before complete."""
        with self._lock:
            stopped, self._queue = self._queue, None
        if stopped is not None:
            stopped.put(None)


def _complete_futures(futures: "queue.Queue") -> None:
    while True:
        item = futures.get()
        if item is None:
            return
        _complete_future(*item)


def _check_guard(guard: Sequence[tuple]) -> None:
    """Raises if a tensor that an asynchronous operation used was resized or `set_` while the
    operation ran (its memory moved: see `_guarded`)."""
    for tensor, address in guard:
        if tensor.data_ptr() != address:
            raise RuntimeError(
                "jaccl: a tensor of this asynchronous operation was resized or set_() while the "
                "operation ran: its results are undefined (the operation used the memory the "
                "tensor had when it started, which resize_() may have freed); do not change a "
                "tensor's storage before its Work completes"
            )


def _guarded(keep: list) -> tuple:
    """What an asynchronous operation keeps alive, and its guard: each tensor's storage as
    well as the tensor, so that `set_()` cannot free the memory the operation uses; and
    `(tensor, data_ptr)`, checked when it completes (`_check_guard`: `resize_()` that grows a
    tensor reallocates its storage in place, which nothing in torch can forbid)."""
    tensors = [t for t in keep if isinstance(t, torch.Tensor)]
    return keep + [t.untyped_storage() for t in tensors], [(t, t.data_ptr()) for t in tensors]


class _P2P:
    """A group's point-to-point operations that are not handed to jaccl yet.

    jaccl runs a group's operations in order, and a receive waits for its data. So that
    `batch_isend_irecv([irecv(left), isend(right)])` on every rank cannot wait for itself,
    messages go to jaccl in pieces of at most `PIECE` bytes (the most a rank blocked sending
    holds read ahead from a peer is 64 MiB per connection), over streams: one per peer and
    direction, each the pieces of its messages in the order they were submitted, so the two
    ends of a stream agree whatever each hands over when. A send's first piece starts at once
    when nothing of its stream waits; every other piece waits here until the next operation
    that is not point to point, a `wait`, a `get_future`, or a poll on the thread that
    submitted them (`flush`), which hands them over in rounds: a piece of each send stream,
    then a piece of each receive stream. A send thus overtakes the receives submitted before
    it by at most one piece, and each rank of a ring alternates sending and receiving pieces.
    When each piece is handed over depends only on the order of submissions on the thread
    that submits them, not on other threads' polls.

    A receive from any source cannot be put in a peer's stream before its sender is known: it
    is a stream of its own, whose first piece takes the next message from any rank and whose
    other pieces come from that piece's sender. Receives go in phases: the receives submitted
    before one from any source are handed over whole before its first piece (it could take
    their messages otherwise), and those submitted after it wait for its last piece (it could
    take theirs); sends go on alternating with each phase. So every message is taken by the
    receive submitted first among those it can match, as MPI matches them."""

    PIECE = 16 << 20

    def __init__(self) -> None:
        # Peer -> [(work, start)]: `start()` hands one piece to jaccl.
        self._sends: Dict[int, "collections.deque"] = {}
        # The receives' phases, each {peer: [(work, start)]}; a receive from any source is a
        # phase of its own, peer None.
        self._receives: "collections.deque[Dict[Optional[int], collections.deque]]" = collections.deque()
        self._lock = threading.Lock()
        self._thread: Optional[int] = None

    def __bool__(self) -> bool:
        return bool(self._sends or self._receives)

    def submit(self, work: _Work, kind: str, peer: Optional[int], pieces: List[Callable[[], Any]]) -> None:
        """Submits `work`'s pieces (its messages to or from `peer`, None: from any source)."""
        with self._lock:
            self._thread = threading.get_ident()
            if kind == "send":
                stream = self._sends.get(peer)
                if stream is None:
                    _begin(work, pieces[0])
                    pieces = pieces[1:]
                    if not pieces:
                        return
                    stream = self._sends[peer] = collections.deque()
            else:
                phases = self._receives
                if peer is None or not phases or None in phases[-1]:
                    phases.append({})
                stream = phases[-1].setdefault(peer, collections.deque())
            work._held, work._p2p = len(pieces), self
            stream.extend((work, start) for start in pieces)

    def submitted_here(self) -> bool:
        return self._thread == threading.get_ident()

    def flush(self) -> None:
        """Hands every held piece to jaccl, in rounds (see the class)."""
        with self._lock:
            sends, self._sends = list(self._sends.values()), {}
            phases, self._receives = self._receives, collections.deque()
            while sends or phases:
                receives = [s for s in phases[0].values() if s] if phases else []
                for stream in sends + receives:
                    work, start = stream.popleft()
                    _begin(work, start)
                    work._held -= 1
                sends = [s for s in sends if s]
                if phases and not any(phases[0].values()):
                    phases.popleft()

    def fail(self, error: BaseException) -> None:
        """Ends every held operation with `error` (the group stopped)."""
        with self._lock:
            streams = list(self._sends.values()) + [s for p in self._receives for s in p.values()]
            self._sends, self._receives = {}, collections.deque()
        for stream in streams:
            for work, _ in stream:
                work._fail(error)


def _begin(work: _Work, start: Callable[[], Any]) -> None:
    """Hands a piece of `work` to jaccl; a failure to start ends `work` with it (and drops
    its other pieces)."""
    if work._error is not None:
        return
    try:
        work._pending.append(start())
    except BaseException as e:
        work._fail(e)


class _Marker(torch._C._distributed_c10d.Backend):
    """What a jaccl group registers as its CPU backend, for torch's bookkeeping (the devices a
    group serves, which `monitored_barrier`, `split_group` and the flight recorder ask for).
    Operations never reach it: they are methods of the group itself."""

    def getBackendName(self) -> str:
        return "jaccl"


class ProcessGroupJaccl(dist.ProcessGroup):
    """A ``torch.distributed`` process group over a jaccl group (made by torch through the
    ``"jaccl"`` backend; see the module's documentation). Operations run in the order they are
    called: blocking ones at once, ``async_op=True`` ones on the jaccl group's progress thread,
    while the caller goes on."""

    def __init__(
        self,
        group: "_native.Group",
        rank: int,
        size: int,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        store: Any = None,
    ) -> None:
        super().__init__(rank, size)
        try:
            marker = _Marker(rank, size)
        except TypeError:  # torch 2.10 makes no backend in Python (nor asks for one)
            marker = None
        if marker is not None:
            kind = dist.ProcessGroup.BackendType.CUSTOM
            self._set_default_backend(kind)
            self._register_backend(torch.device("cpu"), kind, marker)
        self._g = group
        self._timeout = timeout
        self._store = store
        self._completer = _Completer()
        # The thread goes when the group does, if nobody stopped it (`shutdown`).
        weakref.finalize(self, self._completer.stop)
        self._p2p = _P2P()
        self._name = ""
        # What a blocking operation returns: torch waits on it at once and drops it.
        self._completed = _Work([], None)
        self._desc = ""
        self._staging = _Staging()
        self._monitored = 0  # monitored barriers called (their keys in the store)

    # What torch asks of a group.

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def getBackendName(self) -> str:
        return "jaccl"

    def name(self) -> str:
        return "jaccl"

    # torch asks a group's backend for these (`batch_isend_irecv` does, of any group): this
    # group is its own backend, without coalescing (its operations run one by one).
    supports_coalescing = False
    supports_splitting = True

    def _get_backend(self, device: Any) -> "ProcessGroupJaccl":
        return self

    def get_group_store(self) -> Any:
        return self._store

    def eager_connect_single_device(self, device: Any) -> None:
        """What torch calls for `init_process_group(device_id=...)`: nothing to do, a jaccl
        group is connected when it is made."""

    def split_group(
        self,
        ranks: List[int],
        timeout: Optional[datetime.timedelta] = None,
        opts: Any = None,
        group_name: Optional[str] = None,
        group_desc: Optional[str] = None,
        device_types: Any = None,
    ) -> Optional["ProcessGroupJaccl"]:
        """torch's `split_group`: the group of `ranks` (ranks of this group), a jaccl sub-group
        its members make alone; None on the ranks outside it."""
        if self.rank() not in ranks:
            return None
        members, name = list(ranks), group_name or ""
        timeout = self._timeout if timeout is None else timeout
        g = _raising(lambda: self._g.subgroup_of_members(members, name, _at_least_1ms(timeout)))
        store = dist.PrefixStore(f"jaccl/split/{name}/", self._store) if self._store is not None else None
        child = ProcessGroupJaccl(g, members.index(self.rank()), len(members), timeout, store)
        child.setGroupName(name)
        child.setGroupDesc(group_desc or "")
        return child

    def abort(self) -> None:
        """Stops the group from any thread (torchft's watchdog): the operation in flight,
        blocking or not, raises an error caused by ``jaccl.Aborted`` at its next wait, as does
        every later one, and everything the group holds is released."""
        self._stop(self._g.abort, "aborted")

    def shutdown(self) -> None:
        """Closes the group (``destroy_process_group`` calls it): as `abort`, but an idle
        group says goodbye to its peers first."""
        self._stop(self._g.close, "shut down")

    def _stop(self, how: Callable[[], None], what: str) -> None:
        how()
        e = errors.Error(f"rank {self.rank()}: the group was {what} before this operation started")
        e.rank = self.rank()
        self._p2p.fail(e)
        self._completer.stop()

    def __repr__(self) -> str:
        return f"ProcessGroupJaccl(rank={self.rank()}, size={self.size()})"

    def _run(
        self,
        opts: Any,
        calls: List[Callable[[Optional[list]], Any]],
        keep: list,
        result: Any,
        finish: Optional[Callable[[], None]] = None,
        staged: Sequence[torch.Tensor] = (),
    ) -> _Work:
        """Runs `calls` (native calls given their `keep` argument) at once, or on the progress
        thread when the caller asked for an asynchronous operation (torch's `asyncOp`; without
        it, always), and returns their Work. The `staged` buffers go back to the group's
        staging once the calls are done and `finish` has run."""
        if staged:
            copy_out = finish

            def finish() -> None:
                if copy_out is not None:
                    copy_out()
                self._staging.give(staged)

        self._p2p.flush()
        asynchronous = getattr(opts, "asyncOp", True) if opts is not None else True
        if not asynchronous:
            _raising(lambda: [c(None) for c in calls])
            if finish is not None:
                finish()
            return _Work([], result)
        keep, guard = _guarded(keep)
        pending = _raising(lambda: [c(keep) for c in calls])
        return _Work([w for w in pending if w is not None], result, finish, guard, self._completer)

    # Collectives.

    def _blocking(self, opts: Any, tensors: List[torch.Tensor]) -> Optional[torch.Tensor]:
        """The one tensor of a blocking call that can take the short way (contiguous, on the
        CPU, nothing held): what `dist.all_reduce(t)` costs beyond jaccl's own call is then a
        few attribute reads."""
        if opts is None or getattr(opts, "asyncOp", True) or len(tensors) != 1 or self._p2p:
            return None
        t = tensors[0]
        return t if t.is_cpu and t.is_contiguous() else None  # (sparse ones are not contiguous)

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        t = self._blocking(opts, tensors)
        if t is not None:
            kind = getattr(opts.reduceOp, "op", None)
            op = _OPS.get(kind.value) if kind is not None else None
            dtype = _DTYPES.get(t.dtype)
            if op is not None and dtype is not None:
                _raising(lambda: self._g.all_reduce(None, (t.data_ptr(), t.nbytes), dtype, op, None))
                return self._completed
        if len(tensors) == 1 and tensors[0].layout == torch.sparse_coo:
            return self._sparse_allreduce(tensors[0], opts)
        return self.allreduce_coalesced(tensors, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        op, factor = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        bufs = [_Tensor(t, reduced=True) for t in tensors]
        if factor is not None:
            for b in bufs:
                b.buffer.mul_(factor)
        calls = [
            (lambda keep, b=b: self._g.all_reduce(None, b.memory, b.dtype, op, keep)) for b in bufs
        ]
        return self._run(opts, calls, [b.buffer for b in bufs], tensors, _finisher(bufs))

    def _sparse_allreduce(self, tensor: torch.Tensor, opts: Any) -> _Work:
        """The sum of every rank's sparse COO `tensor`, into it (see `_sparse`): at once,
        whether asynchronous or not (it is three jaccl calls, each sized by the one before)."""
        op, factor = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if op != "sum" or factor is not None:
            raise ValueError("jaccl: all_reduce of sparse tensors sums them: only ReduceOp.SUM")
        if tensor.device.type != "cpu":
            raise ValueError(f"jaccl: tensors must be on the CPU, not {tensor.device}")
        dtype = _jaccl_dtype(tensor, reduced=False)
        self._p2p.flush()
        tensor.copy_(_raising(lambda: _sparse.all_reduce_sum(self._g, tensor, dtype)))
        return _Work([], [tensor])

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        t = self._blocking(opts, tensors)
        dtype = _DTYPES.get(t.dtype) if t is not None else None
        if dtype is not None:
            root = opts.rootRank
            _raising(lambda: self._g.broadcast((t.data_ptr(), t.nbytes), dtype, root, None))
            return self._completed
        root = opts.rootRank if opts is not None else 0
        bufs = [_Tensor(t) for t in tensors]
        calls = [(lambda keep, b=b: self._g.broadcast(b.memory, b.dtype, root, keep)) for b in bufs]
        return self._run(opts, calls, [b.buffer for b in bufs], tensors, _finisher(bufs))

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        op, factor = _reduction(opts.reduceOp)
        root = opts.rootRank
        bufs = [_Tensor(t, reduced=True) for t in tensors]
        # The root's result goes over its input (torch's reduce is in place); the others'
        # tensors are left as they are (PREMUL_SUM scales a copy, as NCCL does).
        at_root = self.rank() == root
        scratch = [
            self._staging.take(b.buffer, b.buffer.numel()).copy_(b.buffer.reshape(-1)) if at_root else b.buffer
            for b in bufs
        ]
        if factor is not None:
            scratch = [s.mul_(factor) if at_root else s * factor for s in scratch]

        def call(keep: Optional[list], b: _Tensor, inp: torch.Tensor) -> Any:
            out = b.memory if self.rank() == root else (0, 0)
            return self._g.reduce((inp.data_ptr(), b.memory[1]), out, b.dtype, op, root, keep)

        calls = [(lambda keep, b=b, i=i: call(keep, b, i)) for b, i in zip(bufs, scratch)]
        keep = [b.buffer for b in bufs] + scratch
        finish = _finisher(bufs) if at_root else None
        return self._run(opts, calls, keep, tensors, finish, scratch if at_root else ())

    def allgather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        """`output_tensors[k][r]`: rank r's `input_tensors[k]`."""
        return self._allgather(output_tensors, input_tensors, opts, output_tensors)

    def allgather_coalesced(
        self, output_lists: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        """`output_lists[r][k]`: rank r's `input_tensors[k]` (torch's layout here, the other
        way round from `allgather`'s)."""
        by_input = [[outs[k] for outs in output_lists] for k in range(len(input_tensors))]
        return self._allgather(by_input, input_tensors, opts, output_lists)

    def _allgather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any, result: Any
    ) -> _Work:
        """`allgather`, whose Work's result is `result`."""
        stages = []
        for outs, inp in zip(output_tensors, input_tensors):
            src = _Tensor(inp)
            counts = [t.numel() for t in outs]
            flat = self._staging.take(inp, sum(counts))
            stages.append((src, flat, outs, _uneven(counts)))

        def call(keep: Optional[list], src: _Tensor, flat: torch.Tensor, counts: Optional[list]) -> Any:
            if counts is None:
                return self._g.all_gather(src.memory, _mem(flat), src.dtype, keep)
            return self._g.all_gather_v(src.memory, _mem(flat), counts, src.dtype, keep)

        calls = [(lambda keep, s=s, f=f, c=c: call(keep, s, f, c)) for s, f, _, c in stages]

        def finish() -> None:
            for _, flat, outs, _ in stages:
                _unflatten(flat, outs)

        keep = [t for s, f, _, _ in stages for t in (s.buffer, f)]
        staged = [f for _, f, _, _ in stages]
        return self._run(opts, calls, keep, result, finish, staged)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        outs = [_Tensor(o) for o in outputs]
        pairs = [(o, _Tensor(i, o)) for o, i in zip(outs, inputs)]
        calls = [
            (lambda keep, o=o, i=i: self._g.all_gather(i.memory, o.memory, i.dtype, keep))
            for o, i in pairs
        ]
        keep = [t.buffer for p in pairs for t in p]
        return self._run(opts, calls, keep, outputs, _finisher([o for o, _ in pairs]))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(
        self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None
    ) -> _Work:
        inputs = [self._staging.flat(ins, out) for out, ins in zip(output_tensors, input_lists)]
        counts = [_uneven([t.numel() for t in ins]) for ins in input_lists]
        return self._reduce_scatter(output_tensors, inputs, opts, inputs, counts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        return self._reduce_scatter(outputs, inputs, opts)

    def _reduce_scatter(
        self,
        outputs: List[torch.Tensor],
        inputs: List[torch.Tensor],
        opts: Any,
        staged: Sequence[torch.Tensor] = (),
        uneven: Optional[List[Optional[list]]] = None,
    ) -> _Work:
        """The reduce-scatters of `inputs` into `outputs`; `staged`: see `_run`; `uneven`:
        per input, each rank's element count where they differ (else None)."""
        op, factor = _reduction(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        pairs = []
        for o, i in zip(outputs, inputs):
            dst = _Tensor(o, reduced=True)
            src = _Tensor(i, dst, reduced=True)
            if factor is not None:
                src.buffer = src.buffer * factor
            pairs.append((dst, src))

        def call(keep: Optional[list], o: _Tensor, i: _Tensor, counts: Optional[list]) -> Any:
            if counts is None:
                return self._g.reduce_scatter(i.memory, o.memory, i.dtype, op, keep)
            return self._g.reduce_scatter_v(i.memory, o.memory, counts, i.dtype, op, keep)

        counts = uneven or [None] * len(pairs)
        calls = [(lambda keep, o=o, i=i, c=c: call(keep, o, i, c)) for (o, i), c in zip(pairs, counts)]
        keep = [t.buffer for p in pairs for t in p]
        return self._run(opts, calls, keep, outputs, _finisher([o for o, _ in pairs]), staged)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> _Work:
        o = _Tensor(output)
        i = _Tensor(input, o)
        n = self.size()
        if not input_split_sizes and not output_split_sizes:
            call = lambda keep: self._g.all_to_all(i.memory, o.memory, i.dtype, keep)  # noqa: E731
        else:
            # Elements per row (input[0] would fail on a tensor of no rows).
            row_in = math.prod(input.shape[1:])
            row_out = math.prod(output.shape[1:])
            rows_in = list(input_split_sizes) or [input.shape[0] // n] * n
            rows_out = list(output_split_sizes) or [output.shape[0] // n] * n
            sends = [r * row_in for r in rows_in]
            recvs = [r * row_out for r in rows_out]
            call = lambda keep: self._g.all_to_all_v(  # noqa: E731
                i.memory, sends, o.memory, recvs, i.dtype, keep
            )
        return self._run(opts, [call], [o.buffer, i.buffer], output, _finisher([o]))

    alltoall_base = all_to_all_single

    def alltoall(
        self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        like = input_tensors[0] if input_tensors else output_tensors[0]
        flat_in = self._staging.flat(input_tensors, like)
        flat_out = self._staging.take(like, sum(t.numel() for t in output_tensors))
        dtype = _Tensor(flat_in).dtype
        sends = [t.numel() for t in input_tensors]
        recvs = [t.numel() for t in output_tensors]
        call = lambda keep: self._g.all_to_all_v(  # noqa: E731
            _mem(flat_in), sends, _mem(flat_out), recvs, dtype, keep
        )
        return self._run(
            opts,
            [call],
            [flat_in, flat_out],
            output_tensors,
            lambda: _unflatten(flat_out, output_tensors),
            [flat_in, flat_out],
        )

    def gather(
        self, output_lists: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        root = opts.rootRank
        stages = []
        for k, inp in enumerate(input_tensors):
            src = _Tensor(inp)
            flat = self._staging.take(inp, inp.numel() * self.size() if self.rank() == root else 0)
            outs = output_lists[k] if self.rank() == root else []
            stages.append((src, flat, outs))
        calls = [
            (lambda keep, s=s, f=f: self._g.gather(s.memory, _mem(f), s.dtype, root, keep))
            for s, f, _ in stages
        ]

        def finish() -> None:
            for _, flat, outs in stages:
                _unflatten(flat, outs)

        keep = [t for s, f, _ in stages for t in (s.buffer, f)]
        return self._run(opts, calls, keep, output_lists, finish, [f for _, f, _ in stages])

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        root = opts.rootRank
        o = _Tensor(output) if self.rank() == root else None
        i = _Tensor(input, o)
        out = o.memory if o is not None else (0, 0)
        call = lambda keep: self._g.gather(i.memory, out, i.dtype, root, keep)  # noqa: E731
        keep = [i.buffer] + ([o.buffer] if o is not None else [])
        return self._run(opts, [call], keep, output, _finisher([o] if o is not None else []))

    gather_into_tensor = gather_single

    def scatter(
        self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None
    ) -> _Work:
        root = opts.rootRank
        stages = []
        for k, out in enumerate(output_tensors):
            dst = _Tensor(out)
            flat = self._staging.flat(input_lists[k] if self.rank() == root else [], out)
            stages.append((dst, flat))
        calls = [
            (lambda keep, d=d, f=f: self._g.scatter(_mem(f), d.memory, d.dtype, root, keep))
            for d, f in stages
        ]
        keep = [t for d, f in stages for t in (d.buffer, f)]
        staged = [f for _, f in stages]
        return self._run(opts, calls, keep, output_tensors, _finisher([d for d, _ in stages]), staged)

    # Point to point: messages between two ranks are taken in the order they are sent, and
    # their tags are checked, not matched: a receive whose tag is not the next message's fails
    # with Mismatch naming both (NCCL ignores tags; gloo matches them). Each message goes to
    # jaccl in pieces, when `_P2P` says.

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> _Work:
        return self._p2p_op("send", tensors, dst, tag)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> _Work:
        return self._p2p_op("recv", tensors, src, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> _Work:
        """A receive from any source: its first piece takes the next message from any rank
        (jaccl's `recv_any`), the others come from that piece's sender (see `_P2P`); the
        Work's `source_rank()` is the sender."""
        if len(tensors) != 1:
            raise ValueError("jaccl: a receive from any source takes one tensor")
        return self._p2p_op("recv", tensors, None, tag)

    def _p2p_op(self, kind: str, tensors: List[torch.Tensor], peer: Optional[int], tag: int) -> _Work:
        """`peer`: the other rank (None: a receive from any source)."""
        bufs = [_Tensor(t) for t in tensors]
        keep, guard = _guarded([b.buffer for b in bufs])
        tag = _wire_tag(tag)
        # Each piece names its whole message, so that two ends whose messages differ fail at
        # the first piece even when the pieces agree.
        messages = [(m, b.dtype, _mem(b.buffer)[1]) for b in bufs for m in _pieces(b.buffer)]
        sender: Optional[list] = None
        if peer is None:
            # The first piece's jaccl operation knows the sender once it has received; the
            # later pieces receive from that sender (they run after it: jaccl runs a group's
            # operations in order).
            sender = []
            (m0, d0, w0), rest = messages[0], messages[1:]

            def first() -> Any:
                sender.append(self._g.recv_any(m0, d0, keep, tag, message=w0))
                return sender[0]

            pieces = [first] + [
                (lambda m=m, d=d, w=w: self._g.recv(m, sender[0], d, keep, tag, message=w)) for m, d, w in rest
            ]
        else:
            call = self._g.send if kind == "send" else self._g.recv
            pieces = [(lambda m=m, d=d, w=w: call(m, peer, d, keep, tag, message=w)) for m, d, w in messages]
        finish = _finisher(bufs) if kind == "recv" else None
        work = _Work(None, tensors, finish, guard, self._completer, p2p=True, sender=sender)
        self._p2p.submit(work, kind, peer, pieces)
        return work

    def barrier(self, opts: Any = None) -> _Work:
        return self._run(opts, [lambda keep: self._g.barrier(keep)], [], None)

    def monitored_barrier(
        self, timeout: Optional[datetime.timedelta] = None, wait_all_ranks: bool = False
    ) -> None:
        """torch's debugging barrier, through the group's store (see `_monitored`): rank 0
        raises naming the first rank that did not come within `timeout` (all of them with
        `wait_all_ranks`), the others raise if rank 0 fails; the group stays usable."""
        if self._store is None:
            raise RuntimeError("jaccl: monitored_barrier needs the group's store")
        self._p2p.flush()
        self._monitored += 1
        _monitored.monitored_barrier(
            self._store,
            self.rank(),
            self.size(),
            self._monitored,
            self._timeout if timeout is None else timeout,
            self._timeout,
            wait_all_ranks,
        )


def _wire_tag(tag: int) -> int:
    """torch's tag (a C int, possibly negative) as jaccl's unsigned 32-bit tag."""
    return int(tag) & 0xFFFF_FFFF


def _uneven(counts: List[int]) -> Optional[List[int]]:
    """`counts` (each rank's elements in a list-taking all-gather or reduce-scatter) when they
    differ, which takes jaccl's `_v` form (torch allows uneven lists); else None."""
    return counts if len(set(counts)) > 1 else None


def _mem(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.numel() * t.element_size())


def _pieces(t: torch.Tensor) -> List[tuple]:
    """`(address, length)` of the consecutive pieces of at most `_P2P.PIECE` bytes (whole
    elements) that a message of `t`'s bytes travels in (one, empty, for an empty tensor)."""
    address, length = _mem(t)
    step = max(_P2P.PIECE // t.element_size(), 1) * t.element_size()
    return [(address + at, min(step, length - at)) for at in range(0, length, step)] or [(address, 0)]


def _finisher(bufs: Sequence[_Tensor]) -> Optional[Callable[[], None]]:
    """Copies each staged output back into its tensor, if any was staged."""
    staged = [b for b in bufs if b.buffer is not b.tensor]
    if not staged:
        return None
    return lambda: [b.finish() for b in staged]


register()
