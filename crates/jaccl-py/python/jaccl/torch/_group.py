"""`ProcessGroupJaccl`: the ``torch.distributed`` process group over a jaccl group."""

import datetime
import math
import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from .. import _native, errors
from . import _monitored, _sparse
from ._errors import _raising
from ._types import _DTYPES, _OPS, _reduction, _jaccl_dtype
from ._tensors import _Tensor, _Staging, _unflatten, _mem, _finisher
from ._startup import _at_least_1ms
from ._work import _Work, _Completer, _guarded
from ._p2p import _P2P, _wire_tag, _pieces


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
        self._shrinks = 0  # shrinks of this group (their keys in the store)

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
    # torch's `shrink_group` asks for it: `shrink` explains why torch's own cannot finish.
    supports_shrinking = True

    def shrink(self, ranks_to_exclude: Any = None, shrink_flags: int = 0, opts: Any = None) -> Any:
        """What ``torch.distributed.shrink_group`` calls: it raises, before anything is done,
        saying to call `jaccl.torch.shrink_group` (torch's wraps what a backend returns in a
        C++ ``ProcessGroup`` as a C++ ``c10d::Backend``, which a backend written in Python,
        as this one is, cannot be)."""
        raise TypeError(
            "torch.distributed.shrink_group cannot finish with the jaccl backend: it registers "
            "the shrunk backend in a new C++ ProcessGroup, which takes only backends written in "
            "C++; call jaccl.torch.shrink_group(ranks_to_exclude, group) instead: the same "
            "semantics, every survivor calls it, and it returns the new group"
        )

    def _shrunk(self, ranks_to_exclude: List[int], name: str) -> "ProcessGroupJaccl":
        """The jaccl group of the ranks alive but `ranks_to_exclude`, named `name` (see
        `jaccl.torch.shrink_group`): its keys in the store under a prefix of its own."""
        g = _raising(lambda: self._g.shrink(sorted(set(ranks_to_exclude))))
        # Every survivor shrinks its groups in one order: the count names this one alike.
        self._shrinks += 1
        prefix = f"jaccl/shrink/{name}/{self._shrinks}/"
        store = dist.PrefixStore(prefix, self._store) if self._store is not None else None
        return ProcessGroupJaccl(g, g.rank, g.size, self._timeout, store)

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
        op, factor = _reduction(_reduce_op(opts))
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
        op, factor = _reduction(_reduce_op(opts))
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
        op, factor = _reduction(_reduce_op(opts))
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


def _reduce_op(opts: Any) -> Any:
    """The reduction of `opts`: options that carry one, or a ``ReduceOp`` itself (as
    ``ProcessGroup.allreduce(tensors, op)`` takes it); ``SUM`` without either."""
    if opts is None:
        return dist.ReduceOp.SUM
    return getattr(opts, "reduceOp", opts)


def _uneven(counts: List[int]) -> Optional[List[int]]:
    """`counts` (each rank's elements in a list-taking all-gather or reduce-scatter) when they
    differ, which takes jaccl's `_v` form (torch allows uneven lists); else None."""
    return counts if len(set(counts)) > 1 else None
