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
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _native, errors
from .errors import *  # noqa: F403 (the exceptions are part of the package's API)
from .errors import ConfigError, InvalidArgument

__all__ = ["init", "Group", *errors.__all__]

# Settings of init(), each read as the JACCL_<NAME> variable would be.
_SETTINGS = (
    "rank",
    "size",
    "coordinator",
    "transport",
    "topology",
    "wires",
    "timeout",
    "startup_timeout",
    "liveness",
    "job_token",
    "wait",
    "host_id",
    "ibv_devices",
)

# numpy dtype names jaccl reduces (bfloat16 comes from ml_dtypes).
_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 bfloat16 float32 float64 complex64".split()
)

_OPS = ("sum", "max", "min")


def init(**settings: Any) -> "Group":
    """Joins the group of this process and returns it.

    Settings are keyword arguments named like the ``JACCL_*`` variables, without the prefix
    (``rank``, ``size``, ``coordinator``, ``transport``, ``topology``, ``wires``, ``timeout``,
    ``startup_timeout``, ``liveness``, ``job_token``, ``wait``, ``host_id``, ``ibv_devices``);
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
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._g.closed

    def close(self) -> None:
        """Leaves the group: the connections close (the other ranks' next calls raise
        :class:`PeerLost`) and later calls on this group raise :class:`Error`. Also done when
        the group is garbage-collected, or at the end of a ``with jaccl.init() as g:`` block."""
        self._g.close()

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"jaccl.Group(rank={self.rank}, size={self.size}, topology={self.topology!r}{state})"

    def all_sum(self, x: Any, out: Any = None) -> Any:
        """Element-wise sum over all ranks (see :meth:`all_reduce`)."""
        return self.all_reduce(x, "sum", out)

    def all_max(self, x: Any, out: Any = None) -> Any:
        """Element-wise maximum over all ranks (see :meth:`all_reduce`)."""
        return self.all_reduce(x, "max", out)

    def all_min(self, x: Any, out: Any = None) -> Any:
        """Element-wise minimum over all ranks (see :meth:`all_reduce`)."""
        return self.all_reduce(x, "min", out)

    def all_reduce(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduces ``x`` element-wise over all ranks with ``op`` (``"sum"``, ``"max"``,
        ``"min"``); every rank gets the same bits. Returns ``out`` (same shape and type as
        ``x``; ``out=x`` reduces in place), or a new array."""
        if op not in _OPS:
            raise self._invalid("all_reduce", f"unknown op {op!r} (expected sum, max or min)")
        a, dtype = self._input(x, "all_reduce")
        o, result = self._output(out, a.shape, a.dtype, "all_reduce")
        if _same_memory(a, o):
            self._g.all_reduce(None, _memory(o), dtype, op)
        else:
            a = _unshared(a, o)
            self._g.all_reduce(_memory(a), _memory(o), dtype, op)
        return result

    def all_gather(self, x: Any, out: Any = None) -> Any:
        """Gathers every rank's ``x``: the result has shape ``(size, *x.shape)`` and row ``r``
        is rank r's ``x``."""
        a, dtype = self._input(x, "all_gather")
        o, result = self._output(out, (self.size,) + a.shape, a.dtype, "all_gather")
        a = _unshared(a, o)
        self._g.all_gather(_memory(a), _memory(o), dtype)
        return result

    def reduce_scatter(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduces ``x`` over all ranks and keeps this rank's block: ``x``'s first axis holds
        ``size`` blocks, and the result has shape ``(x.shape[0] // size, *x.shape[1:])``."""
        if op not in _OPS:
            raise self._invalid("reduce_scatter", f"unknown op {op!r} (expected sum, max or min)")
        a, dtype = self._input(x, "reduce_scatter")
        if a.ndim == 0 or a.shape[0] % self.size:
            raise self._invalid(
                "reduce_scatter",
                f"x has shape {a.shape}; its first axis must hold {self.size} equal blocks",
            )
        shape = (a.shape[0] // self.size,) + a.shape[1:]
        o, result = self._output(out, shape, a.dtype, "reduce_scatter")
        a = _unshared(a, o)
        self._g.reduce_scatter(_memory(a), _memory(o), dtype, op)
        return result

    def send(self, x: Any, dst: int) -> None:
        """Sends ``x`` to rank ``dst``, which calls :meth:`recv` with the same shape and type.
        With the ring topology ``dst`` must be a neighbour (``rank ± 1``)."""
        a, dtype = self._input(x, "send")
        self._g.send(_memory(a), _rank(dst), dtype)

    def recv(self, out: Any, src: int) -> Any:
        """Receives into ``out`` what rank ``src`` sends; returns ``out``."""
        o, dtype = self._input(out, "recv")
        _check_writable(o, self, "recv")
        self._g.recv(_memory(o), _rank(src), dtype)
        return out

    def barrier(self) -> None:
        """Returns once every rank has entered."""
        self._g.barrier()

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
        name = a.dtype.name
        if name not in _DTYPES:
            raise self._invalid(
                op,
                f"element type {name} is not supported (jaccl has {', '.join(sorted(_DTYPES))})",
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
    if t.device.type != "cpu":
        raise InvalidArgument(f"tensor is on {t.device}; jaccl works on CPU memory")
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


def _memory(a: np.ndarray) -> Tuple[int, int]:
    """``(address, length)`` of a C-contiguous array's bytes, for jaccl._native (which reads
    and writes them while ``a`` is referenced by the caller)."""
    return (a.__array_interface__["data"][0], a.nbytes)


def _same_memory(a: np.ndarray, o: np.ndarray) -> bool:
    return _memory(a) == _memory(o)


def _unshared(a: np.ndarray, o: np.ndarray) -> np.ndarray:
    """``a``, copied if it overlaps ``o`` (which the call overwrites)."""
    return a.copy() if np.may_share_memory(a, o) else a


def _rank(r: Any) -> int:
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise InvalidArgument(f"a rank must be a non-negative int, not {r!r}")
    return int(r)
