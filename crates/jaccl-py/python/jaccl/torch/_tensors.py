"""Tensors as jaccl reads and writes them: contiguous memory, staging buffers kept
between calls, copies back."""

import collections
import threading
from typing import Callable, Optional, Sequence

import torch

from .. import _overlap
from ._types import _jaccl_dtype


class _Tensor:
    """A tensor as jaccl reads or writes it: its memory, contiguous (a copy when it is not,
    copied back with :meth:`finish` where the call writes it)."""

    __slots__ = ("tensor", "buffer", "dtype")

    def __init__(
        self, tensor: torch.Tensor, apart_from: Optional["_Tensor"] = None, reduced: bool = False
    ) -> None:
        """`apart_from`: the output of the call that reads `tensor`, which it may not share
        memory with (FSDP all-gathers a shard that lies inside the output): then a copy.
        `reduced`: whether the call computes with the elements (else it only moves them)."""
        if tensor.device.type != "cpu":
            raise ValueError(f"jaccl: tensors must be on the CPU, not {tensor.device}")
        if tensor.layout != torch.strided:
            raise ValueError(
                f"jaccl: tensors must be dense, not {tensor.layout} (as with Gloo, only all_reduce "
                "takes sparse COO tensors, and sums them)"
            )
        dtype = _jaccl_dtype(tensor, reduced)
        self.tensor = tensor
        self.buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
        self.dtype = dtype
        if apart_from is not None and _overlap(self.memory, apart_from.memory):
            self.buffer = self.buffer.clone()

    @property
    def memory(self) -> tuple:
        b = self.buffer
        return (b.data_ptr(), b.numel() * b.element_size())

    def finish(self) -> None:
        if self.buffer is not self.tensor:
            self.tensor.copy_(self.buffer)


class _Staging:
    """The contiguous buffers that list-taking operations stage their tensors in (scatter's and
    all-to-all's inputs, gather's and all-gather's outputs, the root's copy of reduce's input),
    kept for the next call of the same type and length: a fresh large tensor costs a page fault
    and zeroed page per 4 KiB (concatenating four 8 MiB tensors took 13 ms into a new tensor and
    2.4 ms into a kept one here). At most `KEPT` buffers and `KEPT_BYTES` stay, the least
    recently used go first; an operation that finds its buffer taken by one still running
    makes another."""

    KEPT = 8
    KEPT_BYTES = 256 << 20

    def __init__(self) -> None:
        self._free: "collections.OrderedDict[tuple, torch.Tensor]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def take(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A 1-D tensor of `like`'s type and `numel` elements, its contents undefined."""
        with self._lock:
            kept = self._free.pop((like.dtype, numel), None)
        return kept if kept is not None else like.new_empty(numel)

    def flat(self, tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """The tensors one after the other in a staged 1-D tensor."""
        buf = self.take(like, sum(t.numel() for t in tensors))
        if tensors:
            torch.cat([t.reshape(-1) for t in tensors], out=buf)
        return buf

    def give(self, tensors: Sequence[torch.Tensor]) -> None:
        """Keeps `tensors` (taken before, their operation done) for the next calls."""
        with self._lock:
            for t in tensors:
                self._free[(t.dtype, t.numel())] = t
                self._free.move_to_end((t.dtype, t.numel()))
            total = sum(t.numel() * t.element_size() for t in self._free.values())
            while self._free and (len(self._free) > self.KEPT or total > self.KEPT_BYTES):
                _, old = self._free.popitem(last=False)
                total -= old.numel() * old.element_size()


def _unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copies `flat` back into `tensors`, one after the other."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def _mem(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.numel() * t.element_size())


def _finisher(bufs: Sequence[_Tensor]) -> Optional[Callable[[], None]]:
    """Copies each staged output back into its tensor, if any was staged."""
    staged = [b for b in bufs if b.buffer is not b.tensor]
    if not staged:
        return None
    return lambda: [b.finish() for b in staged]
