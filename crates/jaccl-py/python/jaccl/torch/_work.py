"""torch's `Work` over jaccl's operations, and the thread that completes their futures."""

import atexit
import datetime
import queue
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from ._errors import _torch_error


# torch's base class of a Python-made Work (renamed over the versions).
_WorkBase = getattr(dist, "_Work", None) or torch._C._distributed_c10d.Work


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
        self._p2p: Any = None  # the group's `_p2p._P2P` (which imports this module)
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
    Started with the first future; ended when the group stops (or is collected), and at the
    latest when the interpreter exits (`_stop_completers`)."""

    # How long a stop waits for the futures before it to complete.
    JOIN_SECONDS = 10.0

    def __init__(self) -> None:
        self._queue: Optional["queue.Queue"] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        _completers.add(self)

    def put(self, future: "torch.futures.Future", work: _Work) -> None:
        with self._lock:
            if self._queue is None:
                self._queue = queue.Queue()
                self._thread = threading.Thread(
                    target=_complete_futures, args=(self._queue,), name="jaccl-futures", daemon=True
                )
                self._thread.start()
            self._queue.put((future, work))

    def stop(self) -> None:
        """Ends the thread once the futures before complete, and waits for that (at most
        `JOIN_SECONDS`). Completing a future runs torch's callbacks in C++; if the interpreter
        began to exit meanwhile, Python ends the thread where it next takes the GIL, which
        those callbacks cannot unwind through: the process aborts (SIGABRT)."""
        with self._lock:
            stopped, self._queue = self._queue, None
            thread, self._thread = self._thread, None
        if stopped is not None:
            stopped.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.JOIN_SECONDS)


# Every group's completer, stopped before the interpreter exits (atexit handlers run while
# daemon threads still may take the GIL).
_completers: "weakref.WeakSet[_Completer]" = weakref.WeakSet()


@atexit.register
def _stop_completers() -> None:
    for completer in list(_completers):
        completer.stop()


def _complete_futures(futures: "queue.Queue") -> None:
    while True:
        item = futures.get()
        if item is None:
            return
        _complete_future(*item)
        # Not kept alive (nor its tensors) while the thread waits for the next one.
        del item


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
