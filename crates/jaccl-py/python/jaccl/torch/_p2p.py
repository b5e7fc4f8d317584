"""Point-to-point messages in pieces, handed to jaccl in an order no ring can deadlock on
(see `_P2P`)."""

import collections
import threading
from typing import Any, Callable, Dict, List, Optional

import torch

from ._tensors import _mem
from ._work import _Work


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


def _wire_tag(tag: int) -> int:
    """torch's tag (a C int, possibly negative) as jaccl's unsigned 32-bit tag."""
    return int(tag) & 0xFFFF_FFFF


def _pieces(t: torch.Tensor) -> List[tuple]:
    """`(address, length)` of the consecutive pieces of at most `_P2P.PIECE` bytes (whole
    elements) that a message of `t`'s bytes travels in (one, empty, for an empty tensor)."""
    address, length = _mem(t)
    step = max(_P2P.PIECE // t.element_size(), 1) * t.element_size()
    return [(address + at, min(step, length - at)) for at in range(0, length, step)] or [(address, 0)]
