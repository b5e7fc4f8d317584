"""jaccl as a ``torch.distributed`` backend: ``init_process_group("jaccl")``.

PyTorch finds it by itself from torch 2.14 on (the ``torch.distributed.backends`` entry point
of this package); with older versions, ``import jaccl.torch`` first. Then every
``torch.distributed`` call on CPU tensors, ``DistributedDataParallel``, FSDP, ``new_group``,
``DeviceMesh`` and the functional collectives run over jaccl::

    import torch.distributed as dist
    dist.init_process_group("jaccl")          # under torchrun, or with init_method / store
    dist.all_reduce(tensor)

Start-up goes through the store torch gives each group: its rank 0 publishes the address of
its coordinator there (under the group's own prefix and the job's id, see `_start_job`), and
the job secret goes from rank 0 to each rank in a box sealed to that rank's key, so that the
store never holds it; a ``JACCL_JOB_TOKEN`` (or ``_FILE``) the user set is used instead.
torch's ``timeout`` is both the start-up and the operation timeout. A group that
``new_group`` makes is a jaccl sub-group of the default one (``jaccl.Group`` formed by its
members alone), with its own connections and timeout. Errors are raised as
``torch.distributed.DistBackendError`` whose cause is the jaccl exception (``PeerLost``,
``Timeout``...), which names the rank and its peer.
"""

from typing import Any

import torch.distributed as dist

from ._errors import _raising
from ._startup import _start_job, _at_least_1ms
from ._group import ProcessGroupJaccl
from ._shrink import shrink_group

__all__ = ["ProcessGroupJaccl", "register", "shrink_group"]


def register() -> None:
    """Registers the ``"jaccl"`` backend with ``torch.distributed`` (for CPU tensors). Called on
    ``import jaccl.torch``, and by torch itself through the package's entry point."""
    if "JACCL" in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend("jaccl", _create, extended_api=True, devices=["cpu"])


def _create(opts: Any, _backend_options: Any = None) -> "ProcessGroupJaccl":
    """torch's creator of a group: the default one is a jaccl job started through the store;
    the others, when the default group is jaccl's, sub-groups of it (formed by their members
    alone, as torch calls this only there), else jobs of their own."""
    rank, size = opts.group_rank, opts.group_size
    timeout = opts.timeout
    members = list(getattr(opts, "global_ranks_in_group", []) or [])
    name = str(getattr(opts, "group_id", "") or "")
    world = dist.group.WORLD if members else None
    if isinstance(world, ProcessGroupJaccl):
        g = _raising(lambda: world._g.subgroup_of_members(members, name, _at_least_1ms(timeout)))
    else:
        g = _start_job(opts.store, rank, size, timeout, name)
    return ProcessGroupJaccl(g, rank, size, timeout, opts.store)


register()
