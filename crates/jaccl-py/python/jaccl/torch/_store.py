"""Waiting on torch's stores: for a key, until a deadline, whatever the store.

Their ``wait`` takes a timeout but keeps it differently: a file store's ends only after the
next whole second past it (0.1 s takes 1 s, 1.0 s takes 2 s), and each store ends in an error
of its own (a file store's is a plain ``RuntimeError``). So `arrived` asks ``wait`` only for
the part of the time that no store can overrun, then asks ``check`` every millisecond or so
for the rest, and a deadline already passed checks once."""

import datetime
import time
from typing import Any

# What a store's `wait` may add to its timeout (a file store: up to the next whole second).
_OVERRUN = 1.0

# How often the last stretch asks `check` (a file store's costs microseconds, a TCP store's a
# round trip).
_POLL = 0.002


def arrived(store: Any, key: str, deadline: float) -> bool:
    """Whether `key` is set by `deadline` (`time.monotonic()`; at once if it has passed)."""
    long_wait = deadline - time.monotonic() - _OVERRUN
    if long_wait >= 0.001:
        try:
            store.wait([key], datetime.timedelta(seconds=min(long_wait, 1e9)))
            return True
        except RuntimeError:
            pass  # the timeout, in whatever error this store gives; a broken store fails below
    while not store.check([key]):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(_POLL, left))
    return True
