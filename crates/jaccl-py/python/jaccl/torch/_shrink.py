"""`shrink_group`: ``torch.distributed.shrink_group`` for groups whose backend is jaccl's.

torch's own (2.15) validates the call, asks the group's backend to shrink, destroys the old
group (and, for the default group, every other group), and registers the new one in its place.
Its last step wraps what the backend returns in a new C++ ``ProcessGroup`` as a C++
``c10d::Backend``, which only a backend written in C++ can be; jaccl's process group is written
in Python (torch's API for third-party backends), so torch's ``shrink_group`` stops there
(``ProcessGroupJaccl.shrink`` says so before anything happens). This function takes the same
steps, with the shrunk jaccl group itself registered in torch's place.
"""

from typing import Any, List, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ._group import ProcessGroupJaccl


# What torch's own shrink_group does with a group, by its private steps (torch 2.15).
_TORCH_STEPS = (
    "_destroy_all_other_groups",
    "_cleanup_process_group_global_state",
    "_update_default_pg",
    "_register_pg_in_world",
    "_process_group_name",
)


def shrink_group(ranks_to_exclude: Optional[List[int]] = None, group: Any = None) -> ProcessGroupJaccl:
    """The group of the ranks of ``group`` (default: the default group) alive and not in
    ``ranks_to_exclude`` (ranks of ``group``), renumbered in their order there: as
    ``torch.distributed.shrink_group``, which this replaces for jaccl groups. Every survivor
    calls it; the excluded ranks do not. Unlike torch's, ranks that died are left out even
    when not listed (jaccl finds them: a process that ended at once, a silent one after the
    liveness window), and the list may be empty. The old group is destroyed; shrinking the
    default group destroys every other group and makes the new one the default.

    Raises ``DistBackendError`` caused by the jaccl exception if the shrink fails, and
    ``ValueError`` for ranks out of range or this rank itself."""
    missing = [f for f in _TORCH_STEPS if not hasattr(c10d, f)]
    if missing:
        raise NotImplementedError(
            f"jaccl.torch.shrink_group takes the steps of torch 2.15's shrink_group; this torch "
            f"({torch.__version__}) lacks {', '.join(missing)}"
        )
    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, ProcessGroupJaccl):
        raise TypeError(f"jaccl.torch.shrink_group shrinks jaccl groups, not {type(pg).__name__}")
    excluded = sorted(set(ranks_to_exclude or []))
    if any(not isinstance(r, int) or r < 0 or r >= pg.size() for r in excluded):
        raise ValueError(f"ranks_to_exclude must be ranks of the group (0 to {pg.size() - 1}): {excluded}")
    if pg.rank() in excluded:
        raise ValueError(f"rank {pg.rank()} is in ranks_to_exclude: the excluded ranks do not call shrink_group")
    global_ranks = dist.get_process_group_ranks(pg)
    # Named before it exists: by the ranks that may be in it (those lost too are left out).
    name = c10d._process_group_name(
        [global_ranks[r] for r in range(pg.size()) if r not in excluded], use_hashed_name=True
    )
    new = pg._shrunk(excluded, name)
    # Which of the old group's ranks the new group holds, in its order: through the job's ranks.
    members = [pg._g.job_ranks.index(j) for j in new._g.job_ranks]

    is_default = pg == c10d._get_default_group()
    backend_name, store = c10d._world.pg_map[pg]
    backend_config = c10d._world.pg_backend_config.get(pg, "")
    if is_default:
        c10d._destroy_all_other_groups(exclude_group=pg)
    try:
        dist.destroy_process_group(pg)
    except Exception:  # a failed group may not close cleanly; its state goes all the same
        pass
    c10d._cleanup_process_group_global_state(pg)
    new.setGroupName(name)
    new.setGroupDesc("default:shrunken" if is_default else f"{pg.getGroupName()}:shrunk")
    if is_default:
        c10d._update_default_pg(new)
    c10d._register_pg_in_world(
        pg=new,
        backend_name=backend_name,
        store=store,
        group_name=name,
        backend_config=backend_config,
        rank_mapping={global_ranks[old]: place for place, old in enumerate(members)},
    )
    return new
