"""The exceptions of jaccl: one class per kind of failure, all subclasses of :class:`Error`.

Every exception carries ``rank`` (the rank that failed), ``peer`` (the other rank involved)
and ``op`` (``"all_reduce"``, ``"send"``, ``"init"``, ...) where they are known, else ``None``.
After a failure while data moved (``PeerLost``, ``Timeout``, ``Mismatch``, ``Deadlock``,
``ProtocolError``, ``IoError``, an interrupt) the group is closed: every later call raises the
same error.

Ctrl-C while a call waits for other ranks raises ``KeyboardInterrupt`` within 100 ms (Python's
signal handlers run while jaccl waits); the call stopped half-way, so the group is closed and
later calls raise :class:`Interrupted`.

A panic in jaccl (a bug) raises :class:`Error` saying it is an internal error; the group is
then closed, and every later call raises the same error.
"""

from typing import Optional


class Error(Exception):
    """A jaccl failure."""

    rank: Optional[int] = None
    peer: Optional[int] = None
    op: Optional[str] = None


class PeerLost(Error, ConnectionError):
    """A peer's process ended, its connection closed, or it stopped answering (liveness). Also
    a :class:`ConnectionError`."""


class Timeout(Error, TimeoutError):
    """No progress for the operation timeout (``JACCL_TIMEOUT``). Also a
    :class:`TimeoutError`."""


class Mismatch(Error):
    """Ranks called different operations, lengths, element types or reductions."""


class Deadlock(Error):
    """Every rank waits for another and no data is on its way (e.g. two ranks that both call
    ``recv`` from each other first): found through the heartbeat instead of the timeout."""


class Interrupted(Error):
    """The group was stopped by an earlier interrupt (Ctrl-C while a call waited: that call
    raised ``KeyboardInterrupt``)."""


class Aborted(Error):
    """The group was aborted: ``Group.abort()``, or ``close()`` while another thread was in a
    call (torch's ``abort()`` and ``shutdown()``). The call in flight stopped half-way; every
    later call raises this too."""


class Revoked(Error):
    """A member revoked the group (:meth:`jaccl.Group.revoke`): the call in flight stopped,
    and every later call raises this too; ``peer`` is the rank that revoked it. The group can
    still :meth:`~jaccl.Group.agree` and :meth:`~jaccl.Group.shrink`."""


class LeftOut(Error):
    """The other ranks agreed, or shrank the group, without this rank: they took it for lost
    (it was stopped, or cut off, for the liveness window) or excluded it."""


class ProtocolError(Error):
    """A peer sent something that is not jaccl's protocol, or a transport failed."""


class BootstrapError(Error):
    """The group could not be formed (coordinator unreachable, start-up timeout, ...)."""


class ConfigError(Error):
    """A setting or environment variable does not parse or does not fit."""


class InvalidArgument(Error, ValueError):
    """A call's arguments are wrong (element type, shape, layout, rank); nothing was sent."""


class Unsupported(Error):
    """The request cannot be served here (e.g. RDMA without a device)."""


class IoError(Error, OSError):
    """The operating system refused something jaccl needed. Also an :class:`OSError`;
    ``errno`` is the operating system's error code where there is one."""


__all__ = [
    "Error",
    "PeerLost",
    "Timeout",
    "Mismatch",
    "Deadlock",
    "Interrupted",
    "Aborted",
    "Revoked",
    "LeftOut",
    "ProtocolError",
    "BootstrapError",
    "ConfigError",
    "InvalidArgument",
    "Unsupported",
    "IoError",
]
