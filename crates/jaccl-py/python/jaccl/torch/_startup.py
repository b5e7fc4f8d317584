"""A jaccl job started through torch's store: the job's id, its coordinator's address and
the sealed job secret (see `_start_job`)."""

import collections
import datetime
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Dict, Optional

from .. import _native, errors
from ._errors import _raising, _start_up_error
from ._store import arrived


# The jaccl jobs this process started, per torch group name: a part of each job's id.
_jobs_started: Dict[str, int] = collections.Counter()


_jobs_lock = threading.Lock()


# What identifies the launcher's job, in a jaccl job's id (with JACCL_JOB_ID, the user's).
_IDENTITY = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "JACCL_JOB_ID")


def _start_job(
    store: Any, rank: int, size: int, timeout: datetime.timedelta, group: str, counted: bool = True
) -> "_native.Group":
    """The jaccl job of `size` ranks that torch's group `group` is, started through `store`
    (already prefixed per group by torch), where rank 0 publishes its coordinator's address.

    The store's keys carry the job's id, which every rank computes alone and alike: the
    launcher's identity, the size, and how many jobs this process started for this group name
    before (every rank makes the same sequence of groups; torch gives a group made again after
    `destroy_process_group` the same prefix). Rank 0 claims the id as its root, the others as
    its members: more claims than that mean that another job with the same identity shares
    this store (or left its keys in it), which fails at once rather than pair ranks of two jobs.
    With `counted` false, the id is the size and `group` alone: for callers whose store is new
    for each job, shared by ranks of different launcher jobs (torchft: each replica group is a
    torchrun job of its own, with its own run id and master port).

    The secret: a user's ``JACCL_JOB_TOKEN``/``_FILE`` as it is; else rank 0 draws 256 bits and
    seals them to each rank's ephemeral public key (`_job_secret`), so a reader of the store
    learns nothing. The secret goes to jaccl in `init`'s settings, never into the environment."""
    identity = [size, group]
    if counted:
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
    secret = _job_secret(store, keys, rank, size, given, deadline)
    if secret is not None:
        settings["JACCL_JOB_TOKEN"] = secret
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


def _job_secret(store: Any, keys: str, rank: int, size: int, given: bool, deadline: float) -> Optional[str]:
    """The job's secret when the user gave no token (``None`` when they did), after checking
    that this rank and rank 0 (rank 0: every rank) agree on whether they did, before any of
    them waits for a secret the other way would bring. One exchange through the store does
    both: each rank publishes ``given``, or the public key of an ephemeral key pair
    (`_native.SealKey`, 32 bytes); rank 0 draws 256 bits and seals them to each rank's key,
    so a reader of the store learns nothing."""
    if rank == 0:
        store.set(f"{keys}token/0", _GIVEN if given else b"sealed")
        secret = None if given else secrets.token_hex(32)
        for q in range(1, size):
            theirs = _await(store, f"{keys}token/{q}", rank, deadline, f"rank {q}'s start")
            _check_same_token(rank, q, given, theirs == _GIVEN)
            if secret is None:
                continue
            try:
                sealed = _native.seal(theirs, secret.encode())
            except errors.Error:
                raise _tampered(rank, f"rank {q}'s public key is not one") from None
            store.set(f"{keys}sealed/{q}", sealed)
        return secret
    key = None if given else _native.SealKey()
    store.set(f"{keys}token/{rank}", _GIVEN if key is None else key.public)
    theirs = _await(store, f"{keys}token/0", rank, deadline, "rank 0's start")
    _check_same_token(rank, 0, given, theirs == _GIVEN)
    if key is None:
        return None
    secret = key.open(_await(store, f"{keys}sealed/{rank}", rank, deadline, "the secret from rank 0"))
    if secret is None:
        raise _tampered(rank, "the job secret sealed for this rank does not open with its key")
    return secret.decode()


# What a rank publishes, instead of a public key, when the user gave the job's token.
_GIVEN = b"given"


def _check_same_token(rank: int, q: int, mine: bool, theirs: bool) -> None:
    """Fails unless rank `q` was given a token exactly when this rank was."""
    if mine != theirs:
        has, lacks = (q, rank) if theirs else (rank, q)
        raise _start_up_error(
            rank,
            f"rank {has} was given a JACCL_JOB_TOKEN or JACCL_JOB_TOKEN_FILE and rank {lacks} "
            "was not: give every rank the same token, or none",
        )


def _await(store: Any, key: str, rank: int, deadline: float, what: str) -> bytes:
    """The value of `key` once a rank sets it, waiting until `deadline` (`time.monotonic()`)."""
    if not arrived(store, key, deadline):
        raise _start_up_error(rank, f"timed out waiting for {what}")
    return store.get(key)


def _tampered(rank: int, what: str) -> BaseException:
    return _start_up_error(
        rank, f"{what}: someone other than this job's ranks wrote the store during start-up"
    )


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
