"""jaccl: collective communication for numpy and PyTorch CPU tensors.

Start the ranks with ``jaccl launch -n 4 -- python train.py`` (or torchrun, mpirun, srun),
then in each::

    import jaccl, numpy as np
    g = jaccl.init()
    total = g.all_sum(np.ones(1000, np.float32))     # every rank gets the same bits

Inputs are C-contiguous numpy arrays of bool, int8-64, uint8-64, float16, bfloat16
(``ml_dtypes``), float32, float64 or complex64; PyTorch CPU tensors; or any object with the
buffer protocol or DLPack. Without ``out=`` a result is a new numpy array; with ``out=`` it is
written there (``out=x`` works in place) and nothing is allocated. Data moves with the GIL
released, straight from and into the arrays' memory: another thread that writes an array
while a call uses it is a data race (the results are undefined), as with any library that
releases the GIL. Failures raise the exceptions of :mod:`jaccl.errors`.
"""

import datetime
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from . import _native, errors
from .errors import *  # noqa: F403 (the exceptions are part of the package's API)
from .errors import ConfigError, InvalidArgument

__all__ = ["init", "Group", "Work", "Agreed", *errors.__all__]

# Settings of init(), each read as the JACCL_<NAME> variable would be.
_SETTINGS = (
    "rank",
    "size",
    "coordinator",
    "transport",
    "topology",
    "wires",
    "link",
    "timeout",
    "startup_timeout",
    "liveness",
    "job_token",
    "wait",
    "host_id",
    "ibv_devices",
    "join",
)

# jaccl's element types by name: numpy's names (bfloat16 comes from ml_dtypes), and torch's
# (`torch.<name>`, see jaccl.torch._types). The one table of them in the package.
_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 bfloat16 float32 float64 complex64".split()
)

# Reductions by name, and the other names they go by (PyTorch's among them).
_OPS = {
    "sum": "sum",
    "max": "max",
    "min": "min",
    "prod": "prod",
    "product": "prod",
    "avg": "avg",
    "mean": "avg",
    "average": "avg",
    "band": "band",
    "bor": "bor",
    "bxor": "bxor",
}
_OP_NAMES = "sum, max, min, prod, avg, band, bor or bxor"


def init(**settings: Any) -> "Group":
    """Joins the group of this process and returns it.

    Settings are keyword arguments named like the ``JACCL_*`` variables, without the prefix
    (``rank``, ``size``, ``coordinator``, ``transport``, ``topology``, ``wires``, ``link``
    (``"100Gb/s,2us"``), ``timeout``, ``startup_timeout``, ``liveness``, ``job_token``,
    ``wait``, ``host_id``, ``ibv_devices``, ``join``: an invitation from
    :meth:`Group.invitation`, to join a running group when its members call :meth:`Group.grow`);
    they take precedence over the environment, which gives the rest (``jaccl launch``,
    torchrun, mpirun, srun). Durations are a ``datetime.timedelta``, seconds (``30``,
    ``2.5``), or a string as the variables take (``"500ms"``, ``"5m"``, ``"off"``). With nothing
    set, the group has one rank.

    Raises :class:`ConfigError` for an unknown or unreadable setting, :class:`BootstrapError`
    when the group cannot be formed.
    """
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)}; expected some of {', '.join(_SETTINGS)}"
        )
    variables = {f"JACCL_{k.upper()}": _setting(v) for k, v in settings.items() if v is not None}
    # Start-up waits for the other ranks (up to the start-up timeout): it runs on a helper
    # thread so that Ctrl-C here raises at once (the helper is a daemon; a group it still
    # forms afterwards is dropped, which the other ranks see as this rank leaving).
    outcome: dict = {}

    def start() -> None:
        try:
            outcome["group"] = _native.init(variables)
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e

    helper = threading.Thread(target=start, name="jaccl-init", daemon=True)
    helper.start()
    while helper.is_alive():
        helper.join(0.1)
    if "error" in outcome:
        raise outcome["error"]
    return Group(outcome["group"])


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, datetime.timedelta):
        return _seconds(value)
    return str(value)


def _seconds(duration: Any) -> str:
    """A duration (``timedelta``, or seconds as a number) as jaccl reads one: seconds."""
    if isinstance(duration, datetime.timedelta):
        duration = duration.total_seconds()
    return repr(float(duration))


class Group:
    """The ranks of a job. Every rank must call the same operations in the same order, with
    matching shapes and element types."""

    def __init__(self, native: "_native.Group") -> None:
        self._g = native

    @property
    def rank(self) -> int:
        """This process's rank, ``0 .. size - 1``."""
        return self._g.rank

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self._g.size

    @property
    def transport(self) -> List[Tuple[int, str]]:
        """``[(peer, "shm" | "tcp" | "rdma")]`` for each peer this rank has links to."""
        return self._g.transport

    @property
    def topology(self) -> Optional[str]:
        """``"ring"``, ``"mesh"``, or ``None`` for a group of one."""
        return self._g.topology

    @property
    def hosts(self) -> List[List[int]]:
        """The ranks on each host, ascending, the same on every rank: ranks share a host when
        their host identities are equal (the machine's, refined by ``JACCL_HOST_ID``). Hosts
        are numbered in the order of their lowest rank."""
        return self._g.hosts

    @property
    def host(self) -> int:
        """This rank's host, an index into :attr:`hosts`."""
        return self._g.host

    @property
    def local_rank(self) -> int:
        """This rank's place among the ranks of its host (0 for the lowest)."""
        return self._g.local_rank

    @property
    def local_size(self) -> int:
        """How many ranks share this rank's host (itself included)."""
        return len(self._g.hosts[self._g.host])

    @property
    def job_ranks(self) -> List[int]:
        """The job's rank of each rank of this group (the group ``init`` made: ``0 .. size -
        1``): how a group from :meth:`shrink`, :meth:`split` or :meth:`subgroup` maps to the
        job, and through it to the group it came from."""
        return self._g.job_ranks

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._g.closed

    def close(self) -> None:
        """Leaves the group: the connections close (the other ranks' next calls raise
        :class:`PeerLost`) and later calls on this group raise :class:`Error`. Also done when
        the group is garbage-collected, or at the end of a ``with jaccl.init() as g:`` block.
        A call that another thread is in stops (it raises :class:`Aborted`, an operation
        started with ``async_op=True`` :class:`Error`) and is waited for."""
        self._g.close()

    def abort(self) -> None:
        """Stops the group from any thread, without waiting for the call in flight (blocking or
        ``async_op=True``), which stops at its next wait and raises :class:`Aborted` within
        moments, as does every later call; the group is closed as by :meth:`close`. For
        watchdogs: a call stuck on a peer that never comes ends at once."""
        self._g.abort()

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"jaccl.Group(rank={self.rank}, size={self.size}, topology={self.topology!r}{state})"

    def split(self, color: Optional[int], key: int = 0) -> Optional["Group"]:
        """Splits the group as ``MPI_Comm_split`` does: every rank calls it; ranks with the same
        ``color`` form a new group, ordered by ``key`` and then by their rank here; a rank
        passing ``None`` gets ``None``. The new group has every method, its own connections
        and algorithms (ranks of one host share memory), and can be used from another thread
        while this one is in use. Ranks that call it differently raise :class:`Mismatch`."""
        if color is not None and not _is_int(color, 2**32):
            raise self._invalid("split", f"color must be None or an int from 0 to 2**32 - 1, not {color!r}")
        if not _is_int(key, 2**32):
            raise self._invalid("split", f"key must be an int from 0 to 2**32 - 1, not {key!r}")
        g = self._g.split(None if color is None else int(color), int(key))
        return None if g is None else Group(g)

    def subgroup(self, ranks: Any) -> Optional["Group"]:
        """A new group of ``ranks`` (ranks of this group, in their new order): every rank calls
        it with the same list; the others get ``None``. See :meth:`split`."""
        g = self._g.subgroup([_rank(r) for r in ranks])
        return None if g is None else Group(g)

    def revoke(self) -> None:
        """Revokes the group on every member, from any thread, without waiting: each member's
        call in flight stops and raises :class:`Revoked` naming this rank (``peer``), as does
        every later call. The group can still :meth:`agree` and :meth:`shrink` (unlike after
        :meth:`abort`, which closes it)."""
        self._g.revoke()

    def agree(self, flag: bool = True) -> "Agreed":
        """Agrees among the ranks alive on the AND of ``flag`` and on which ranks are alive
        (``MPIX_Comm_agree``): every living rank calls it and gets the same :class:`Agreed`,
        whichever ranks died, rank 0 included, even after the group failed or was revoked.
        A rank counts as lost when its process ended, or when it did not answer for the
        liveness window. Raises :class:`LeftOut` if the others went on without this rank."""
        flag, alive, lost = self._g.agree(bool(flag))
        return Agreed(flag, alive, lost)

    def shrink(self, exclude: Any = ()) -> "Group":
        """The group of the ranks alive, renumbered in their order here, with connections and
        algorithms chosen afresh (``MPIX_Comm_shrink``, ``ncclCommShrink``): after a
        :class:`PeerLost` (or :class:`Revoked`), every survivor calls it and goes on with the
        new group; rank 0 may be the one lost. Ranks in ``exclude`` are left out whether they
        live or not (they do not call it); every caller passes the same ones. This group stays
        as it was: close it. ::

            try:
                g.all_reduce(grads, out=grads)
            except (jaccl.PeerLost, jaccl.Revoked):
                g = g.shrink()          # then redo the step
        """
        ranks = sorted({_rank(r) for r in exclude})
        return Group(self._g.shrink(ranks))

    def invitation(self) -> str:
        """The invitation to this group's next :meth:`grow`, the same text on every member
        (until the group grows or splits). Give it to each process that is to join, as
        ``JACCL_JOIN`` or ``jaccl.init(join=...)``; it holds no secret (joining takes the job's
        token, ``JACCL_JOB_TOKEN``, as every rank does)."""
        return self._g.invitation()

    def grow(self, count: int) -> "Group":
        """The group with ``count`` new processes (``ncclCommGrow``): every member calls it, and
        ``count`` processes join with :meth:`invitation` (their ``jaccl.init(join=...)``
        returns the grown group). Members keep their ranks; the newcomers follow, in the order
        they came. Waits for them up to the start-up timeout (:class:`BootstrapError` if fewer
        came; this group goes on). This group stays as it was: close it. ::

            invitation = g.invitation()
            if g.rank == 0:
                subprocess.Popen([sys.executable, "train.py"],
                                 env={**os.environ, "JACCL_JOIN": invitation})
            g = g.grow(1)               # then send the newcomer the weights
        """
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"grow takes a number of processes, not {count!r}")
        if count < 1:
            raise ValueError(f"grow takes at least one process, not {count}")
        return Group(self._g.grow(count))

    def all_sum(self, x: Any, out: Any = None, async_op: bool = False) -> Any:
        """Element-wise sum over all ranks (see :meth:`all_reduce`)."""
        return self.all_reduce(x, "sum", out, async_op)

    def all_max(self, x: Any, out: Any = None, async_op: bool = False) -> Any:
        """Element-wise maximum over all ranks (see :meth:`all_reduce`)."""
        return self.all_reduce(x, "max", out, async_op)

    def all_min(self, x: Any, out: Any = None, async_op: bool = False) -> Any:
        """Element-wise minimum over all ranks (see :meth:`all_reduce`)."""
        return self.all_reduce(x, "min", out, async_op)

    def all_reduce(self, x: Any, op: str = "sum", out: Any = None, async_op: bool = False) -> Any:
        """Reduces ``x`` element-wise over all ranks with ``op``: ``"sum"``, ``"max"``,
        ``"min"``, ``"prod"``, ``"avg"`` (the sum divided by the ranks; integers round toward
        zero), or bitwise ``"band"``, ``"bor"``, ``"bxor"`` (integers and bool); every rank gets
        the same bits. Returns ``out`` (same shape and type as ``x``; ``out=x`` reduces in
        place), or a new array."""
        op = self._op(op, "all_reduce")
        a, dtype = self._input(x, "all_reduce")
        o, result = self._output(out, a.shape, a.dtype, "all_reduce")
        mo = _memory(o)
        if _same_memory(a, o, mo):
            work = self._g.all_reduce(None, mo, dtype, op, _keep(async_op, o))
        else:
            a, ma, mo = _apart(a, o, mo)
            work = self._g.all_reduce(ma, mo, dtype, op, _keep(async_op, a, o))
        return _outcome(work, result)

    def all_gather(self, x: Any, out: Any = None, async_op: bool = False) -> Any:
        """Gathers every rank's ``x``: the result has shape ``(size, *x.shape)`` and row ``r``
        is rank r's ``x``."""
        a, dtype = self._input(x, "all_gather")
        o, result = self._output(out, (self.size,) + a.shape, a.dtype, "all_gather")
        a, ma, mo = _apart(a, o)
        work = self._g.all_gather(ma, mo, dtype, _keep(async_op, a, o))
        return _outcome(work, result)

    def reduce_scatter(
        self, x: Any, op: str = "sum", out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces ``x`` over all ranks and keeps this rank's block: ``x``'s first axis holds
        ``size`` blocks, and the result has shape ``(x.shape[0] // size, *x.shape[1:])``."""
        op = self._op(op, "reduce_scatter")
        a, dtype = self._input(x, "reduce_scatter")
        shape = self._blocks(a, "reduce_scatter")
        o, result = self._output(out, shape, a.dtype, "reduce_scatter")
        a, ma, mo = _apart(a, o)
        work = self._g.reduce_scatter(ma, mo, dtype, op, _keep(async_op, a, o))
        return _outcome(work, result)

    def broadcast(self, x: Any, root: int = 0, out: Any = None, async_op: bool = False) -> Any:
        """Rank ``root``'s ``x`` on every rank: every rank passes an array of the same shape
        and type (other ranks' values are not read). Returns ``out`` (``out=x`` broadcasts in
        place, as ``torch.distributed.broadcast`` does), or a new array."""
        a, dtype = self._input(x, "broadcast")
        o, result = self._output(out, a.shape, a.dtype, "broadcast")
        mo = _memory(o)
        if not _same_memory(a, o, mo):
            np.copyto(o, a)
        work = self._g.broadcast(mo, dtype, _rank(root), _keep(async_op, o))
        return _outcome(work, result)

    def reduce(
        self, x: Any, op: str = "sum", root: int = 0, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces ``x`` over all ranks with ``op`` (as :meth:`all_reduce`) to rank ``root``,
        which gets the result (``out``, or a new array); the other ranks get ``None`` (an
        ``out`` they pass is not written)."""
        op = self._op(op, "reduce")
        a, dtype = self._input(x, "reduce")
        if self.rank != root:
            work = self._g.reduce(_memory(a), (0, 0), dtype, op, _rank(root), _keep(async_op, a))
            return _outcome(work, None)
        o, result = self._output(out, a.shape, a.dtype, "reduce")
        a, ma, mo = _apart(a, o)
        work = self._g.reduce(ma, mo, dtype, op, _rank(root), _keep(async_op, a, o))
        return _outcome(work, result)

    def gather(self, x: Any, root: int = 0, out: Any = None, async_op: bool = False) -> Any:
        """Every rank's ``x`` to rank ``root``, which gets shape ``(size, *x.shape)`` (row r
        is rank r's ``x``); the other ranks get ``None``."""
        a, dtype = self._input(x, "gather")
        if self.rank != root:
            work = self._g.gather(_memory(a), (0, 0), dtype, _rank(root), _keep(async_op, a))
            return _outcome(work, None)
        o, result = self._output(out, (self.size,) + a.shape, a.dtype, "gather")
        a, ma, mo = _apart(a, o)
        work = self._g.gather(ma, mo, dtype, _rank(root), _keep(async_op, a, o))
        return _outcome(work, result)

    def scatter(
        self, x: Any = None, root: int = 0, out: Any = None, async_op: bool = False
    ) -> Any:
        """Row block ``r`` of rank ``root``'s ``x`` (whose first axis holds ``size`` equal
        blocks) to rank r: the result has shape ``(x.shape[0] // size, *x.shape[1:])``. The
        other ranks pass ``out`` (or an ``x`` of the root's shape, which is not read)."""
        is_root = self.rank == root
        if x is None and (is_root or out is None):
            raise self._invalid("scatter", "x is needed on the root, and elsewhere x or out")
        if x is not None:
            a, dtype = self._input(x, "scatter")
            shape = self._blocks(a, "scatter")
            o, result = self._output(out, shape, a.dtype, "scatter")
        else:
            o, dtype = self._input(out, "scatter")
            _check_writable(o, self, "scatter")
            result = out
        if not is_root:
            work = self._g.scatter((0, 0), _memory(o), dtype, _rank(root), _keep(async_op, o))
            return _outcome(work, result)
        a, ma, mo = _apart(a, o)
        work = self._g.scatter(ma, mo, dtype, _rank(root), _keep(async_op, a, o))
        return _outcome(work, result)

    def all_to_all(self, x: Any, out: Any = None, async_op: bool = False) -> Any:
        """Row block ``d`` of ``x`` (whose first axis holds ``size`` equal blocks) to rank d;
        block ``s`` of the result (the same shape as ``x``) is what rank s sent this rank."""
        a, dtype = self._input(x, "all_to_all")
        self._blocks(a, "all_to_all")
        o, result = self._output(out, a.shape, a.dtype, "all_to_all")
        a, ma, mo = _apart(a, o)
        work = self._g.all_to_all(ma, mo, dtype, _keep(async_op, a, o))
        return _outcome(work, result)

    def all_to_all_v(
        self, x: Any, send_counts: Any, recv_counts: Any, out: Any = None, async_op: bool = False
    ) -> Any:
        """All-to-all with uneven blocks: the first ``send_counts[0]`` rows of ``x`` to rank
        0, the next ``send_counts[1]`` to rank 1, ...; the result has ``sum(recv_counts)``
        rows, ``recv_counts[s]`` from rank s, in rank order. A rank's ``send_counts[d]`` must
        be rank d's ``recv_counts[rank]`` (else :class:`Mismatch` on every rank, before any
        data moves); zeros are fine."""
        a, dtype = self._input(x, "all_to_all_v")
        sends = self._counts(send_counts, "send_counts", "all_to_all_v")
        recvs = self._counts(recv_counts, "recv_counts", "all_to_all_v")
        rows = a.shape[0] if a.ndim else 1
        if sum(sends) != rows:
            raise self._invalid(
                "all_to_all_v", f"send_counts add up to {sum(sends)}, but x has {rows} rows"
            )
        o, result = self._output(out, (sum(recvs),) + a.shape[1:], a.dtype, "all_to_all_v")
        per_row = _row_elements(a)
        a, ma, mo = _apart(a, o)
        work = self._g.all_to_all_v(
            ma,
            [c * per_row for c in sends],
            mo,
            [c * per_row for c in recvs],
            dtype,
            _keep(async_op, a, o),
        )
        return _outcome(work, result)

    def all_gather_v(
        self, x: Any, counts: Any, out: Any = None, async_op: bool = False
    ) -> Any:
        """Gathers every rank's ``x`` when their first axes differ: ``counts[r]`` is rank r's
        number of rows (the same ``counts`` on every rank); the result stacks them in rank
        order, ``sum(counts)`` rows."""
        a, dtype = self._input(x, "all_gather_v")
        counts = self._counts(counts, "counts", "all_gather_v")
        o, result = self._output(out, (sum(counts),) + a.shape[1:], a.dtype, "all_gather_v")
        per_row = _row_elements(a)
        a, ma, mo = _apart(a, o)
        counts = [c * per_row for c in counts]
        work = self._g.all_gather_v(ma, mo, counts, dtype, _keep(async_op, a, o))
        return _outcome(work, result)

    def reduce_scatter_v(
        self, x: Any, counts: Any, op: str = "sum", out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduces ``x`` over all ranks (as :meth:`all_reduce`) and keeps this rank's rows:
        ``counts[r]`` rows for rank r, in rank order (the same ``counts`` on every rank)."""
        op = self._op(op, "reduce_scatter_v")
        a, dtype = self._input(x, "reduce_scatter_v")
        counts = self._counts(counts, "counts", "reduce_scatter_v")
        shape = (counts[self.rank],) + a.shape[1:]
        o, result = self._output(out, shape, a.dtype, "reduce_scatter_v")
        per_row = _row_elements(a)
        a, ma, mo = _apart(a, o)
        work = self._g.reduce_scatter_v(
            ma,
            mo,
            [c * per_row for c in counts],
            dtype,
            op,
            _keep(async_op, a, o),
        )
        return _outcome(work, result)

    def send(self, x: Any, dst: int, async_op: bool = False, tag: int = 0) -> Any:
        """Sends ``x`` to rank ``dst`` (any other rank), which calls :meth:`recv` with the
        same shape, type and ``tag``. The first message to a rank that is not a ring
        neighbour makes the connection (kept for the next ones).

        Messages between two ranks arrive in the order they were sent: tags (0 to 2**32 - 1)
        are checked, not matched, so a ``recv`` whose tag is not the next message's raises
        :class:`Mismatch` naming both, rather than taking it."""
        a, dtype = self._input(x, "send")
        work = self._g.send(_memory(a), _rank(dst), dtype, _keep(async_op, a), _tag(tag))
        return _outcome(work, None)

    def recv(self, out: Any, src: int, async_op: bool = False, tag: int = 0) -> Any:
        """Receives into ``out`` what rank ``src`` sends with the same ``tag`` (see
        :meth:`send`); returns ``out``."""
        o, dtype = self._input(out, "recv")
        _check_writable(o, self, "recv")
        work = self._g.recv(_memory(o), _rank(src), dtype, _keep(async_op, o), _tag(tag))
        return _outcome(work, out)

    def recv_any(self, out: Any, async_op: bool = False, tag: int = 0) -> Any:
        """Receives into ``out`` the next message from any other rank (``MPI_ANY_SOURCE``),
        sent with the same shape, type and ``tag`` (checked as :meth:`recv` checks them);
        returns the sender's rank (with ``async_op=True``, a :class:`Work` whose ``result()``
        and ``source`` are the sender). Of several messages that have begun to arrive, senders
        are taken in turn, starting after the previous ``recv_any``'s; messages from one rank
        arrive in the order it sent them."""
        o, dtype = self._input(out, "recv_any")
        _check_writable(o, self, "recv_any")
        work = self._g.recv_any(_memory(o), dtype, _keep(async_op, o), _tag(tag))
        return work if not async_op else Work(work, None)

    def barrier(self, async_op: bool = False) -> Any:
        """Returns once every rank has entered."""
        return _outcome(self._g.barrier(_keep(async_op)), None)

    def _op(self, op: str, call: str) -> str:
        """jaccl's name of the reduction ``op``."""
        name = _OPS.get(op) if isinstance(op, str) else None
        if name is None:
            raise self._invalid(call, f"unknown op {op!r} (expected {_OP_NAMES})")
        return name

    def _blocks(self, a: np.ndarray, op: str) -> Tuple[int, ...]:
        """The shape of one of the ``size`` row blocks of ``a``."""
        if a.ndim == 0 or a.shape[0] % self.size:
            raise self._invalid(
                op, f"x has shape {a.shape}; its first axis must hold {self.size} equal blocks"
            )
        return (a.shape[0] // self.size,) + a.shape[1:]

    def _counts(self, counts: Any, name: str, op: str) -> List[int]:
        """``counts`` as ``size`` non-negative ints."""
        try:
            if not all(_is_int(c, 2**63) for c in counts):
                raise TypeError
            values = [int(c) for c in counts]
        except TypeError:
            raise self._invalid(op, f"{name} must be a sequence of ints from 0 to 2**63 - 1, not {counts!r}") from None
        if len(values) != self.size:
            raise self._invalid(
                op, f"{name} must hold {self.size} non-negative counts, not {values}"
            )
        return values

    def _input(self, x: Any, op: str) -> Tuple[np.ndarray, str]:
        """``x`` as a numpy array (no copy) and jaccl's name of its element type."""
        a = _as_array(x)
        if a is None:
            raise self._invalid(
                op,
                f"cannot read a {type(x).__name__}: pass a numpy array, a CPU tensor, or an "
                "object with the buffer protocol or DLPack",
            )
        if not a.flags.c_contiguous:
            raise self._invalid(op, "the array is not C-contiguous (use np.ascontiguousarray)")
        name = _dtype_name(a.dtype)
        if name is None:
            raise self._invalid(
                op,
                f"element type {a.dtype} is not supported (jaccl has {', '.join(sorted(_DTYPES))}, "
                "in this machine's byte order)",
            )
        return a, name

    def _output(
        self, out: Any, shape: Tuple[int, ...], dtype: np.dtype, op: str
    ) -> Tuple[np.ndarray, Any]:
        """The array to write the result to, and what to return: ``out`` as given, or a new
        array."""
        if out is None:
            o = np.empty(shape, dtype)
            return o, o
        o, _ = self._input(out, op)
        _check_writable(o, self, op)
        if o.shape != tuple(shape) or o.dtype != dtype:
            raise self._invalid(
                op,
                f"out has shape {o.shape} and type {o.dtype}; expected shape {tuple(shape)} "
                f"and type {dtype}",
            )
        return o, out

    def _invalid(self, op: str, why: str) -> InvalidArgument:
        e = InvalidArgument(f"rank {self.rank}: {op}: {why}")
        e.rank, e.op = self.rank, op
        return e


class Agreed(NamedTuple):
    """What :meth:`Group.agree` decided, the same on every rank that returns it."""

    flag: bool
    """The AND of the flags of the ranks in ``alive``."""
    alive: List[int]
    """The ranks that took part, ascending."""
    lost: List[int]
    """The ranks that did not: their process ended, or they did not answer for the liveness
    window."""


class Work:
    """A nonblocking operation, returned by every method of :class:`Group` called with
    ``async_op=True``: the operation runs on the group's progress thread, after those started
    before it, while this thread goes on. It keeps the arrays it uses alive until it ends; do
    not write them meanwhile (a data race), nor read its result before :meth:`wait`."""

    def __init__(self, native: "_native.Work", result: Any) -> None:
        self._w = native
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        """Waits until the operation ends (at most ``timeout``: seconds or a ``timedelta``;
        ``None``: no limit). Returns True once it has ended, False if the timeout passed first;
        raises the operation's :mod:`jaccl.errors` exception if it failed. Ctrl-C raises
        ``KeyboardInterrupt`` here (the operation goes on)."""
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        return self._w.wait(None if timeout is None else float(timeout))

    def is_completed(self) -> bool:
        """Whether the operation has ended (well or not: :meth:`wait` then tells)."""
        return self._w.is_completed()

    def result(self) -> Any:
        """Waits for the operation and returns what the blocking call would have returned
        (for :meth:`Group.recv_any`, the sender)."""
        self.wait()
        source = self._w.source
        return self._result if source is None else source

    @property
    def source(self) -> Optional[int]:
        """The sender of a :meth:`Group.recv_any` once it has received (else ``None``)."""
        return self._w.source

    def __repr__(self) -> str:
        return f"jaccl.Work(completed={self.is_completed()})"


def _keep(async_op: bool, *arrays: np.ndarray) -> Optional[List[np.ndarray]]:
    """For a nonblocking call, the arrays its operation must keep alive; else ``None``."""
    return list(arrays) if async_op else None


def _outcome(work: Optional["_native.Work"], result: Any) -> Any:
    """What a call returns: its result, or for a nonblocking one the :class:`Work`."""
    return result if work is None else Work(work, result)


def _as_array(x: Any) -> Optional[np.ndarray]:
    """``x`` viewed as a numpy array without copying: an array, a PyTorch tensor (on the
    CPU), a DLPack producer, or a buffer; ``None`` if it is none of those."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.split(".")[0] == "torch":
        return _torch_array(x)
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        return None


def _torch_array(t: Any) -> np.ndarray:
    """A CPU tensor's memory as a numpy array (bfloat16 through ml_dtypes)."""
    if not t.is_cpu:
        raise InvalidArgument(f"tensor is on {t.device}; jaccl works on CPU memory")
    if t.requires_grad:
        t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        return t.view(_torch_int16()).numpy().view(_bfloat16())
    return t.numpy()


def _torch_int16() -> Any:
    import torch

    return torch.int16


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError as e:
        raise InvalidArgument("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from e
    return np.dtype(ml_dtypes.bfloat16)


def _check_writable(a: np.ndarray, g: Group, op: str) -> None:
    if not a.flags.writeable:
        raise g._invalid(op, "out is read-only")


# jaccl's name of each supported numpy dtype met so far: numpy computes `dtype.name` in
# Python, 3.5 µs a call on the development VM, longer than an 8-byte all-reduce.
_DTYPE_NAMES: Dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> Optional[str]:
    """jaccl's name of ``dtype``, or ``None`` if jaccl does not have it (nor the same type in
    the other byte order: jaccl reduces in this machine's)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None and dtype.isnative and dtype.name in _DTYPES:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def _memory(a: np.ndarray) -> Tuple[int, int]:
    """``(address, length)`` of a C-contiguous array's bytes, for jaccl._native (which reads
    and writes them while ``a`` is referenced by the caller)."""
    return (a.__array_interface__["data"][0], a.nbytes)


def _same_memory(a: np.ndarray, o: np.ndarray, o_memory: Tuple[int, int]) -> bool:
    """Whether ``a`` is ``o`` (whose ``_memory`` is ``o_memory``), or views the same bytes."""
    return a is o or _memory(a) == o_memory


def _apart(
    a: np.ndarray, o: np.ndarray, mo: Optional[Tuple[int, int]] = None
) -> Tuple[np.ndarray, Tuple[int, int], Tuple[int, int]]:
    """``a``, copied if it overlaps ``o`` (which the call overwrites), and the ``_memory`` of
    both (``mo``: that of ``o``, if known)."""
    mo = _memory(o) if mo is None else mo
    ma = _memory(a)
    if _overlap(ma, mo):
        a = a.copy()
        ma = _memory(a)
    return a, ma, mo


def _overlap(a: Tuple[int, int], b: Tuple[int, int]) -> bool:
    """Whether two ``(address, length)`` ranges share a byte (the native module refuses a call
    whose input overlaps its output; the package copies such an input first)."""
    return a[1] > 0 and b[1] > 0 and a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _row_elements(a: np.ndarray) -> int:
    """Elements per row (along the first axis) of ``a``."""
    return int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim else 1


def _is_int(v: Any, bound: int) -> bool:
    """Whether ``v`` is an int (not a bool) from 0 to ``bound - 1``: the native calls take
    fixed-size unsigned ints, and an int beyond one must be an InvalidArgument, not an
    OverflowError."""
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and 0 <= v < bound


def _rank(r: Any) -> int:
    if not _is_int(r, 2**63):
        raise InvalidArgument(f"a rank must be a non-negative int, not {r!r}")
    return int(r)


def _tag(t: Any) -> int:
    if not _is_int(t, 2**32):
        raise InvalidArgument(f"a tag must be an int from 0 to 2**32 - 1, not {t!r}")
    return int(t)
