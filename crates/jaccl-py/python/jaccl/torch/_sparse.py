"""Sparse all-reduce for the torch backend: the sum of every rank's sparse COO tensor.

Computed as Gloo computes it, without a dense buffer of the whole shape (a sparse gradient is a
few rows of a large embedding): each rank coalesces its tensor; the ranks all-gather their
layouts (sparse and dense dimensions, non-zeros, shape), then their indices and values with
jaccl's all_gather_v, in rank order; each rank then coalesces all of the ranks' entries taken
together, which sums the duplicates. Every rank coalesces the same tensor, and coalescing on
the CPU is a sort of the indices followed by a sum in that order, the same on every rank: so
every rank gets the same bits."""

from typing import Any

import torch


def all_reduce_sum(g: Any, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    """The sum over the ranks of `g` (a jaccl._native group) of their sparse COO `tensor`s,
    whose values go as jaccl's element type `dtype`; raises ValueError if their shapes or
    layouts differ."""
    mine = tensor.coalesce()
    size, sparse_dim = g.size, mine.sparse_dim()
    layout = torch.tensor([sparse_dim, mine.dense_dim(), mine._nnz(), *mine.shape], dtype=torch.int64)
    layouts = torch.empty((size, layout.numel()), dtype=torch.int64)
    g.all_gather(_memory(layout), _memory(layouts), "int64", None)
    others = torch.cat([layouts[:, :2], layouts[:, 3:]], 1)
    if not bool((others == torch.cat([layout[:2], layout[3:]])).all()):
        raise ValueError(
            "jaccl: all_reduce of sparse tensors: the ranks' tensors differ in shape or layout "
            f"(per rank: sparse dims, dense dims, non-zeros, shape: {layouts.tolist()})"
        )
    counts = layouts[:, 2].tolist()
    indices = mine._indices().t().contiguous()  # a row of sparse_dim indices per non-zero
    values = mine._values().contiguous()  # a row of values per non-zero
    per_row = values.shape[1:].numel()
    all_indices = indices.new_empty((sum(counts), sparse_dim))
    all_values = values.new_empty((sum(counts), *values.shape[1:]))
    g.all_gather_v(_memory(indices), _memory(all_indices), [c * sparse_dim for c in counts], "int64", None)
    g.all_gather_v(_memory(values), _memory(all_values), [c * per_row for c in counts], dtype, None)
    return torch.sparse_coo_tensor(all_indices.t(), all_values, mine.shape).coalesce()


def _memory(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.nbytes)
