"""jaccl as a torchft process group: ``jaccl.torch.torchft.ProcessGroupJaccl``, which
torchft's ``Manager`` reconfigures at each change of the quorum, as it does its
``ProcessGroupGloo`` (torchft is an optional dependency: ``pip install torchft``)::

    from jaccl.torch.torchft import ProcessGroupJaccl
    manager = torchft.Manager(pg=ProcessGroupJaccl(), min_replica_size=1, ...)
    model = torchft.DistributedDataParallel(manager, model)

Each ``configure`` forms a new jaccl group of the quorum's replicas through the store address
torchft gives (which is new each time, so no key is shared with the group before), after
closing the old one; ``abort`` (torchft's watchdog, from any thread) stops the operation in
flight at its next wait, and ``errored`` says why the group failed, when it has.
"""

import datetime
from typing import Any, Optional

import torch.distributed as dist
from torchft.process_group import ProcessGroupWrapper, create_store_client

from ._errors import _raising, _torch_error
from ._group import ProcessGroupJaccl as _Group
from ._startup import _at_least_1ms, _start_job

__all__ = ["ProcessGroupJaccl"]


class ProcessGroupJaccl(ProcessGroupWrapper):
    """A torchft process group over jaccl: reconfigurable (``configure`` forms a new group
    through the store at the address given), abortable from any thread. ``timeout`` bounds the
    start-up of each configuration and every operation (``set_timeout`` changes it, for the
    group in use too)."""

    def __init__(self, timeout: datetime.timedelta = datetime.timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._failure: Optional[BaseException] = None

    def getBackendName(self) -> str:
        return "torchft-jaccl"

    def rank(self) -> int:
        """This rank in the current configuration (torchft's wrappers say 0); 0 before the
        first."""
        pg = self._pg
        return pg.rank() if pg is not None else super().rank()

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: Optional[int] = None,
        group_rank: Optional[int] = None,
        group_world_size: Optional[int] = None,
        global_ranks: Optional[list] = None,
    ) -> None:
        # The old group goes first: its peers see this rank leave, and its operations end.
        self.shutdown()
        super().configure(
            store_addr,
            replica_id,
            rank,
            world_size,
            quorum_id,
            group_rank,
            group_world_size,
            global_ranks,
        )
        # A new group: what happened to the old one (an abort, even one that came while
        # this configured) is no longer this group's error.
        self._failure = None

    def _create_pg(self, store: Any, rank: int, world_size: int) -> dist.ProcessGroup:
        # torchft gives each configuration a store prefix of its own: the job is this one.
        g = _start_job(store, rank, world_size, self._timeout, "torchft", counted=False)
        return _Group(g, rank, world_size, self._timeout, store)

    def abort(self, errored: bool = True) -> None:
        """Stops the group from any thread: the operation in flight raises at its next wait
        (an error caused by ``jaccl.Aborted``), and the group is released; ``configure``
        makes the next. A ``configure`` in progress is not stopped: it ends by itself within
        the timeout (as Gloo's does)."""
        if errored and self._failure is None:
            self._failure = dist.DistBackendError("the jaccl process group was aborted")
        super().abort(errored)  # the group's own abort, then it is released

    def shutdown(self) -> None:
        """Closes the group (its peers' next calls fail, naming this rank)."""
        pg, self._pg = self._pg, None
        if isinstance(pg, _Group):
            pg.shutdown()

    def errored(self) -> Optional[BaseException]:
        """Why the group can no longer be used, if it cannot: it was aborted, or an operation
        failed on it (a peer lost, a timeout), as its operations raised it (a
        ``DistBackendError`` caused by the jaccl error); ``None`` while it works. It does not
        wait for an operation in flight on another thread."""
        if self._failure is not None:
            return self._failure
        pg = self._pg
        failure = pg._g.failure() if isinstance(pg, _Group) else None
        return None if failure is None else _torch_error(failure)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        super().set_timeout(timeout)
        pg = self._pg
        if isinstance(pg, _Group):
            pg._timeout = timeout
            _raising(lambda: pg._g.set_timeout(_at_least_1ms(timeout)))

    def __repr__(self) -> str:
        return f"ProcessGroupJaccl(pg={self._pg})"

