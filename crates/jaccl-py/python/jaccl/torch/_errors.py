"""Errors as torch raises them: jaccl's as ``DistBackendError`` (the jaccl exception
its cause), argument errors as ``ValueError``, start-up's as jaccl's ``BootstrapError``."""

from typing import Any, Callable

import torch.distributed as dist

from .. import errors


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


def _start_up_error(rank: int, why: str) -> BaseException:
    e = errors.BootstrapError(f"rank {rank}: init: start-up through torch's store: {why}")
    e.rank, e.op = rank, "init"
    return _torch_error(e)
