"""torch's element types and reductions as jaccl names them."""

from typing import Any

import torch
import torch.distributed as dist

from .. import _DTYPES as _JACCL_DTYPES


# jaccl's element type of each torch dtype: torch names them as jaccl does (`torch.float32`
# is "float32"); the unsigned types of 16 to 64 bits only in newer versions.
_DTYPES = {getattr(torch, name): name for name in sorted(_JACCL_DTYPES) if hasattr(torch, name)}


# How operations that only move data (all but the reductions) carry a type jaccl lacks (torch's
# float8s, which FSDP2 all-gathers with float8 training): as unsigned integers of its size.
_MOVED_AS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


_R = dist.ReduceOp.RedOpType if hasattr(dist.ReduceOp, "RedOpType") else dist.ReduceOp


# jaccl's reduction of each torch one, by the enum's value (PREMUL_SUM: the input scaled, then
# summed). Keyed by value: hashing torch's enum costs more than an 8-byte all-reduce's Python.
_OPS = {
    int(_R.SUM): "sum",
    int(_R.AVG): "avg",
    int(_R.PRODUCT): "prod",
    int(_R.MIN): "min",
    int(_R.MAX): "max",
    int(_R.BAND): "band",
    int(_R.BOR): "bor",
    int(_R.BXOR): "bxor",
}


_PREMUL_SUM = getattr(_R, "PREMUL_SUM", None)


def _reduction(op: Any) -> tuple:
    """jaccl's name of torch's reduction `op`, and PREMUL_SUM's factor (else None)."""
    kind = getattr(op, "op", op)
    if _PREMUL_SUM is not None and kind == _PREMUL_SUM:
        # The factor: an attribute in newer torch versions, before that only in its state.
        factor = getattr(op, "factor", None)
        if factor is None:
            factor = op.__getstate__()[1]
        return "sum", factor
    try:
        name = _OPS.get(int(kind))
    except (TypeError, ValueError):
        name = None
    if name is None:
        raise ValueError(f"jaccl: unsupported reduction {op}")
    return name, None


def _jaccl_dtype(tensor: torch.Tensor, reduced: bool) -> str:
    """jaccl's element type for `tensor`'s, in a call that computes with the elements
    (`reduced`) or only moves them (then any type, as unsigned integers of its size)."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None and not reduced:
        dtype = _MOVED_AS.get(tensor.element_size())
    if dtype is None:
        what = "reduced" if reduced else "moved"
        raise ValueError(f"jaccl: element type {tensor.dtype} cannot be {what} by jaccl")
    return dtype
