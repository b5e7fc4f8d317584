"""What each rank runs for test_torch.py, under torchrun: ``python torch_ranks.py CASE``.

Written only against torch's public API: the backend is found by name (``"jaccl"``) through
the package's entry point, with no jaccl import (for torch versions without entry points,
``JACCL_TORCH_IMPORT=1`` makes it ``import jaccl.torch``, as their users must). Each case prints ``RESULT <json>`` lines;
a case that finds a wrong value prints what and where instead of raising, so every rank
reports."""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

if os.environ.get("JACCL_TORCH_IMPORT"):
    import jaccl.torch  # noqa: F401

DTYPES = [
    torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
] + [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]
R = dist.ReduceOp


def report(value):
    print("RESULT " + json.dumps(value), flush=True)


def values(rank, n, dtype, op=None):
    """Rank `rank`'s `n` values: small, so sums, products (0, 1, 2) and averages are exact."""
    i = torch.arange(n)
    if dtype == torch.bool:
        return ((i + rank) % 3 != 0) if op in (R.MIN, R.PRODUCT, R.BAND) else ((i + rank) % 3 == 0)
    v = (i * 7 + rank * 3) % 11
    if op == R.PRODUCT:
        v = v % 3
    if dtype.is_complex:
        return (v + 1j * ((v + 2) % 5)).to(dtype)
    return v.to(dtype)


def reference(op, arrays):
    a = torch.stack(arrays)
    if a.dtype == torch.bool:
        a = a.to(torch.int64)
        r = {R.SUM: a.amax(0), R.MAX: a.amax(0), R.MIN: a.amin(0), R.PRODUCT: a.prod(0),
             R.BAND: a.amin(0), R.BOR: a.amax(0), R.BXOR: a.sum(0) % 2}[op]
        return r.to(torch.bool)
    wide = a.to(torch.complex128 if a.is_complex() else torch.float64)
    if op == R.SUM:
        return wide.sum(0).to(a.dtype)
    if op == R.AVG:
        if a.is_floating_point() or a.is_complex():
            return (wide.sum(0) / len(arrays)).to(a.dtype)
        s = wide.sum(0).to(torch.int64)
        return torch.div(s, len(arrays), rounding_mode="trunc").to(a.dtype)
    if op == R.PRODUCT:
        return wide.prod(0).to(a.dtype)
    if op == R.MAX:
        return a.amax(0) if not a.is_complex() else None
    if op == R.MIN:
        return a.amin(0) if not a.is_complex() else None
    f = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
    out = a[0].clone()
    for x in a[1:]:
        out = f(out, x)
    return out


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.MAX, R.MIN, R.PRODUCT, R.BAND, R.BOR, R.BXOR]
    if dtype.is_complex:
        return [R.SUM, R.AVG]  # what torch allows on complex tensors
    ops = [R.SUM, R.AVG, R.PRODUCT, R.MAX, R.MIN]
    if not (dtype.is_floating_point or dtype.is_complex):
        ops += [R.BAND, R.BOR, R.BXOR]
    return ops


def supported(dtype):
    """Whether this torch can do the arithmetic the references need on `dtype`."""
    try:
        reference(R.SUM, [values(0, 2, dtype), values(1, 2, dtype)])
        return True
    except (RuntimeError, TypeError):
        return False


def collectives():
    """Every collective of torch.distributed on every dtype, against references."""
    r, n = dist.get_rank(), dist.get_world_size()
    wrong = []

    def check(what, got, expect):
        if expect is not None and not torch.equal(got.to(expect.dtype), expect):
            wrong.append(f"{what}: {got.tolist()[:6]} != {expect.tolist()[:6]}")

    for dtype in DTYPES:
        if not supported(dtype):
            continue
        name = str(dtype)
        for length in (1, 37):
            for op in ops_for(dtype):
                t = values(r, length, dtype, op)
                try:
                    expect = reference(op, [values(q, length, dtype, op) for q in range(n)])
                except (RuntimeError, TypeError):
                    continue  # this torch cannot compute the reference on this dtype
                dist.all_reduce(t, op=op)
                check(f"all_reduce {name} {op} {length}", t, expect)
                t = values(r, length, dtype, op)
                dist.reduce(t, dst=n - 1, op=op)
                if r == n - 1:
                    check(f"reduce {name} {op}", t, expect)
            for root in range(n):
                t = values(r, length, dtype)
                dist.broadcast(t, src=root)
                check(f"broadcast {name} root {root}", t, values(root, length, dtype))
            mine = values(r, length, dtype)
            out = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(out, mine)
            for q in range(n):
                check(f"all_gather {name} from {q}", out[q], values(q, length, dtype))
            # Lists of uneven tensors (rank q gives q + length elements), which torch allows.
            out = [torch.empty(q + length, dtype=dtype) for q in range(n)]
            dist.all_gather(out, values(r, r + length, dtype))
            for q in range(n):
                check(f"uneven all_gather {name} from {q}", out[q], values(q, q + length, dtype))
            if dtype != torch.bool:
                got = torch.empty(r + length, dtype=dtype)
                dist.reduce_scatter(got, [values(r * 10 + d, d + length, dtype) for d in range(n)])
                expect = reference(R.SUM, [values(q * 10 + r, r + length, dtype) for q in range(n)])
                check(f"uneven reduce_scatter {name}", got, expect)
            flat = torch.empty(n * length, dtype=dtype)
            dist.all_gather_into_tensor(flat, mine)
            check(f"all_gather_into_tensor {name}", flat, torch.cat([values(q, length, dtype) for q in range(n)]))
            whole = [values(r * 10 + k, length, dtype) for k in range(n)]
            if dtype != torch.bool:
                got = torch.empty(length, dtype=dtype)
                dist.reduce_scatter(got, whole)
                check(f"reduce_scatter {name}", got, reference(R.SUM, [values(q * 10 + r, length, dtype) for q in range(n)]))
                got = torch.empty(length, dtype=dtype)
                dist.reduce_scatter_tensor(got, torch.cat(whole))
                check(f"reduce_scatter_tensor {name}", got, reference(R.SUM, [values(q * 10 + r, length, dtype) for q in range(n)]))
            # Gather and scatter to and from every root.
            for root in range(n):
                out = [torch.empty_like(mine) for _ in range(n)] if r == root else None
                dist.gather(mine, out, dst=root)
                if r == root:
                    for q in range(n):
                        check(f"gather {name} root {root} from {q}", out[q], values(q, length, dtype))
                got = torch.empty_like(mine)
                dist.scatter(got, [values(root * 10 + q, length, dtype) for q in range(n)] if r == root else None, src=root)
                check(f"scatter {name} root {root}", got, values(root * 10 + r, length, dtype))
            # All-to-all, even and uneven (rank s sends s + d + 1 rows to rank d), and of lists.
            send = [values(r * 100 + d, (r + d) % 3, dtype) for d in range(n)]
            recv = [torch.empty((s + r) % 3, dtype=dtype) for s in range(n)]
            dist.all_to_all(recv, send)
            for s in range(n):
                check(f"all_to_all list {name} from {s}", recv[s], values(s * 100 + r, (s + r) % 3, dtype))
            rows_out = [s + r + 1 for s in range(n)]
            rows_in = [r + d + 1 for d in range(n)]
            inp = torch.cat([values(r * 100 + d, (r + d + 1) * 2, dtype).reshape(-1, 2) for d in range(n)])
            out = torch.empty(sum(rows_out), 2, dtype=dtype)
            dist.all_to_all_single(out, inp, rows_out, rows_in)
            expect = torch.cat([values(s * 100 + r, (s + r + 1) * 2, dtype).reshape(-1, 2) for s in range(n)])
            check(f"all_to_all_single uneven {name}", out, expect)
            # Rank 0 sends no rows (its input has shape (0, 4)); the others one row to each.
            inp = torch.cat([values(r * 100 + d, 4, dtype).reshape(1, 4) for d in range(n)]) if r else torch.empty(0, 4, dtype=dtype)
            out = torch.empty(n - 1, 4, dtype=dtype)
            dist.all_to_all_single(out, inp, [int(s > 0) for s in range(n)], [int(r > 0)] * n)
            expect = torch.cat([values(s * 100 + r, 4, dtype).reshape(1, 4) for s in range(1, n)])
            check(f"all_to_all_single from no rows {name}", out, expect)
            out = torch.empty(n * length, dtype=dtype)
            dist.all_to_all_single(out, torch.cat([values(r * 100 + d, length, dtype) for d in range(n)]))
            check(f"all_to_all_single {name}", out, torch.cat([values(s * 100 + r, length, dtype) for s in range(n)]))
    # Types jaccl cannot reduce (torch's float8s) still move, as bytes; reducing them fails.
    for dtype in [getattr(torch, t) for t in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, t)]:
        name = str(dtype)

        def bits(seed, length):  # the values of `seed` in `dtype`, compared as bytes
            return values(seed, length, torch.float32).to(dtype)

        for root in range(n):
            t = bits(r, 37)
            dist.broadcast(t, src=root)
            check(f"broadcast {name} root {root}", t.view(torch.uint8), bits(root, 37).view(torch.uint8))
        flat = torch.empty(n * 37, dtype=dtype)
        dist.all_gather_into_tensor(flat, bits(r, 37))
        check(f"all_gather_into_tensor {name}", flat.view(torch.uint8),
              torch.cat([bits(q, 37) for q in range(n)]).view(torch.uint8))
        recv = [torch.empty((s + r) % 3, dtype=dtype) for s in range(n)]
        dist.all_to_all(recv, [bits(r * 100 + d, (r + d) % 3) for d in range(n)])
        for s in range(n):
            check(f"all_to_all list {name} from {s}", recv[s].view(torch.uint8), bits(s * 100 + r, (s + r) % 3).view(torch.uint8))
        out = torch.empty(n * 5, dtype=dtype)
        dist.all_to_all_single(out, torch.cat([bits(r * 100 + d, 5) for d in range(n)]))
        check(f"all_to_all_single {name}", out.view(torch.uint8),
              torch.cat([bits(s * 100 + r, 5) for s in range(n)]).view(torch.uint8))
        try:
            dist.all_reduce(bits(r, 3))
            wrong.append(f"all_reduce {name}: no error")
        except ValueError as e:
            if "cannot be reduced" not in str(e):
                wrong.append(f"all_reduce {name}: {e}")
    # PREMUL_SUM: each input scaled, then summed.
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    check("premul_sum", t, torch.full((5,), sum(0.5 * (q + 1) for q in range(n))))
    # Every ordered pair of ranks, send and recv, with tags (negative and above 2^16 too).
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            tag = src * 70_000 - dst
            if r == src:
                dist.send(torch.full((3,), src * 10 + dst), dst=dst, tag=tag)
            elif r == dst:
                got = torch.empty(3, dtype=torch.int64)
                dist.recv(got, src=src, tag=tag)
                check(f"send {src} -> {dst}", got, torch.full((3,), src * 10 + dst))
    # A ring exchange in a batch whose receives come first, and isend/irecv waited in reverse.
    left, right = (r - 1) % n, (r + 1) % n
    got = torch.empty(4)
    ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, torch.full((4,), float(r)), right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv ring", got, torch.full((4,), float(left)))
    inbox = [torch.empty(2) for _ in range(3)]
    handles = [dist.irecv(t, src=left) for t in inbox] + [dist.isend(torch.full((2,), float(r * 10 + k)), dst=right) for k in range(3)]
    for h in reversed(handles):
        h.wait()
    for k, t in enumerate(inbox):
        check(f"irecv {k} from {left}", t, torch.full((2,), float(left * 10 + k)))
    # A receive polled until it completes (for at most 30 s), its send posted after it.
    got = torch.empty(3)
    polled = dist.irecv(got, src=left)
    dist.isend(torch.full((3,), float(r)), dst=right)
    deadline = time.monotonic() + 30
    while not polled.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    check("irecv polled with is_completed", got, torch.full((3,), float(left)))
    # Non-contiguous tensors work (through a copy).
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()
    expect = t * n
    dist.all_reduce(t)
    check("non-contiguous all_reduce", t, expect)
    base = torch.zeros(n, 6)
    view = base[:, ::2]
    dist.all_gather_into_tensor(view, torch.full((3,), float(r)))
    check("non-contiguous all_gather output", view, torch.arange(n, dtype=torch.float32).repeat_interleave(3).reshape(n, 3))
    # Async handles, waited in reverse; blocking calls in between run after them.
    works = [(k, torch.full((1000,), float(r + k))) for k in range(16)]
    handles = [dist.all_reduce(t, async_op=True) for _, t in works]
    b = torch.ones(1)
    dist.all_reduce(b)
    check("blocking after async", b, torch.full((1,), float(n)))
    for (k, t), h in reversed(list(zip(works, handles))):
        h.wait()
        check(f"async all_reduce {k}", t, torch.full((1000,), float(sum(q + k for q in range(n)))))
    # Operations that stage their lists, in flight together (each with a staging buffer of its
    # own, given back as it ends and reused by the next), waited in reverse.
    for _ in range(2):
        outs = [[torch.empty(5) for _ in range(n)] for _ in range(3)]
        handles = [dist.all_gather(outs[k], torch.full((5,), float(r * 10 + k)), async_op=True) for k in range(3)]
        for h in reversed(handles):
            h.wait()
        for k in range(3):
            for q in range(n):
                check(f"async all_gather {k} from {q}", outs[k][q], torch.full((5,), float(q * 10 + k)))
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    check("future", fut.wait()[0], torch.full((3,), float(n)))
    # The functional collectives find the group by its name.
    import torch.distributed._functional_collectives as funcol
    got = funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
    check("functional all_reduce", got, torch.full((4,), float(n)))
    got = funcol.wait_tensor(funcol.all_gather_tensor(torch.full((2,), float(r)), 0, dist.group.WORLD))
    check("functional all_gather", got, torch.arange(n, dtype=torch.float32).repeat_interleave(2))
    # The object collectives (pickles of different lengths over the byte collectives).
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": r, "pad": "x" * r})
    if objects != [{"rank": q, "pad": "x" * q} for q in range(n)]:
        wrong.append(f"all_gather_object: {objects}")
    listed = [r, "from"] if r == n - 1 else [None, None]
    dist.broadcast_object_list(listed, src=n - 1)
    if listed != [n - 1, "from"]:
        wrong.append(f"broadcast_object_list: {listed}")
    gathered = [None] * n if r == 0 else None
    dist.gather_object(("gathered", r), gathered, dst=0)
    if r == 0 and gathered != [("gathered", q) for q in range(n)]:
        wrong.append(f"gather_object: {gathered}")
    mine = [None]
    dist.scatter_object_list(mine, [("scattered", q) for q in range(n)] if r == 1 else None, src=1)
    if mine != [("scattered", r)]:
        wrong.append(f"scatter_object_list: {mine}")
    if r == 0:
        dist.send_object_list([{"to": n - 1}, 2.5], dst=n - 1)
    elif r == n - 1:
        inbox = [None, None]
        dist.recv_object_list(inbox, src=0)
        if inbox != [{"to": n - 1}, 2.5]:
            wrong.append(f"recv_object_list: {inbox}")
    dist.barrier()
    report({"wrong": wrong, "backend": dist.get_backend(), "name": dist.group.WORLD.group_name})


def groups():
    """new_group, a 2 x 2 DeviceMesh, split_group and monitored_barrier (4 ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    r = dist.get_rank()
    wrong = []
    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    mine = evens if r % 2 == 0 else odds
    t = torch.full((3,), float(r))
    dist.all_reduce(t, group=mine)
    expect = 2.0 if r % 2 == 0 else 4.0
    if t.tolist() != [expect] * 3:
        wrong.append(f"new_group all_reduce: {t.tolist()}")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        g = mesh.get_group(dim)
        t = torch.full((2,), float(r))
        dist.all_reduce(t, group=g)
        members = dist.get_process_group_ranks(g)
        if t.tolist() != [float(sum(members))] * 2:
            wrong.append(f"mesh {dim} {members}: {t.tolist()}")
        if dist.get_backend(g) != "jaccl":
            wrong.append(f"mesh {dim} backend {dist.get_backend(g)}")
    # split_group: torch 2.10 splits only groups bound to an accelerator.
    try:
        halves = dist.split_group(split_ranks=[[0, 1], [2]])  # rank 3 in neither
        outside = halves is None or halves == dist.GroupMember.NON_GROUP_MEMBER
        if outside != (r == 3):
            wrong.append(f"split_group member: {halves}")
        elif not outside:
            t = torch.full((2,), float(r * r + 1))
            dist.all_reduce(t, group=halves)
            expect = 3.0 if r < 2 else 5.0
            if t.tolist() != [expect] * 2 or dist.get_backend(halves) != "jaccl":
                wrong.append(f"split_group all_reduce: {t.tolist()}")
            dist.monitored_barrier(group=halves)
    except RuntimeError as e:
        if "No device associated" not in str(e):
            wrong.append(f"split_group: {e}")
    # monitored_barrier: passes when all come; names the rank that did not (rank 3); the group
    # stays usable. torch 2.10 lets only gloo groups run it.
    try:
        dist.monitored_barrier()
        if r != 3:
            try:
                dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)
                wrong.append("monitored_barrier without rank 3: no error")
            except dist.DistBackendError as e:
                if r == 0 and "Ranks 3 failed to pass monitoredBarrier" not in str(e):
                    wrong.append(f"monitored_barrier error on rank 0: {e}")
        t = torch.ones(1)
        dist.all_reduce(t)
        if t.item() != 4.0:
            wrong.append(f"all_reduce after monitored_barrier: {t.item()}")
    except ValueError as e:
        if "GLOO" not in str(e):
            wrong.append(f"monitored_barrier: {e}")
    report({"wrong": wrong})


def settings_given_to_jaccl():
    """The settings the backend passes to jaccl when it starts a job (the job secret among
    them), recorded as they go by: the test's way to read the secret."""
    import jaccl._native

    given, start = {}, jaccl._native.init

    def recorded(settings):
        given.update(settings)
        return start(settings)

    jaccl._native.init = recorded
    return given


def everything_stored():
    """Every key and value of the default group's store: a file store's file, or a TCP
    store's keys and their values."""
    base = dist.distributed_c10d._get_default_store()
    while hasattr(base, "underlying_store"):
        base = base.underlying_store
    if isinstance(base, dist.FileStore):
        return [open(os.environ["TEST_FILE"], "rb").read()]
    keys = base.list_keys()
    return [k.encode() for k in keys] + [base.get(k) for k in keys]


def secret_is_kept(given):
    """Whether the job secret jaccl got appears in no store key or value, nor in this
    process's environment (given: what `settings_given_to_jaccl` recorded)."""
    secret = given["JACCL_JOB_TOKEN"].encode()
    environ = open("/proc/self/environ", "rb").read()
    return len(secret) >= 32 and all(secret not in v for v in everything_stored() + [environ])


def init_methods():
    """The default group made with the init method or store of argv[2] (2 ranks; the store: a
    prefix store over a TCP store); the secret that start-up passed to jaccl is nowhere in the
    store or the environment; monitored_barrier over that store names a rank that does not
    come, and a zero timeout fails at once."""
    how = sys.argv[2]
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    given = settings_given_to_jaccl()
    if how == "env":
        dist.init_process_group("jaccl", init_method="env://")
    elif how == "tcp":
        # torchrun's agent store would stand in for the tcp:// one in some torch versions.
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        port = int(os.environ["TEST_SPARE_PORT"])
        dist.init_process_group("jaccl", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=n)
    elif how == "file":
        dist.init_process_group("jaccl", init_method="file://" + os.environ["TEST_FILE"], rank=r, world_size=n)
    else:
        store = dist.TCPStore("127.0.0.1", int(os.environ["TEST_SPARE_PORT"]), n, r == 0)
        store = dist.PrefixStore("user/", store)
        dist.init_process_group("jaccl", store=store, rank=r, world_size=n, timeout=timedelta(seconds=20))
    t = torch.ones(2)
    dist.all_reduce(t)
    kept = secret_is_kept(given)
    monitored = []
    dist.monitored_barrier(timeout=timedelta(seconds=10))
    if r == 0:
        for timeout, expect in [
            (timedelta(seconds=1), "Rank 1 failed to pass monitoredBarrier in 1000 ms"),
            (timedelta(0), "Rank 0 timed out in monitoredBarrier after 0 ms"),
        ]:
            try:
                dist.monitored_barrier(timeout=timeout)
                monitored.append(f"{timeout}: no error")
            except dist.DistBackendError as e:
                if expect not in str(e):
                    monitored.append(str(e))
    dist.barrier()
    report({"sum": t.tolist(), "secret_kept": kept, "monitored": monitored})


def user_token():
    """A JACCL_JOB_TOKEN the user set is used as it is (2 ranks): the same on both ranks, the
    job forms and nothing is sealed in the store; different, start-up fails authenticating;
    on rank 1 only, start-up fails on both ranks saying so."""
    r = int(os.environ["RANK"])
    given = settings_given_to_jaccl()
    os.environ["JACCL_JOB_TOKEN"] = "the user's token, the same on every rank"
    dist.init_process_group("jaccl", timeout=timedelta(seconds=20))
    t = torch.ones(2)
    dist.all_reduce(t)
    sealed = [v for v in everything_stored() if b"/sealed/" in v]
    dist.destroy_process_group()
    os.environ["JACCL_JOB_TOKEN"] = f"a token of rank {r} alone, not of the others"
    try:
        dist.init_process_group("jaccl", timeout=timedelta(seconds=4))
        failed = None
    except dist.DistBackendError as e:
        failed = [type(e.__cause__).__name__, str(e)]
    # A token on rank 1 only: both fail at once (well within the 60 s timeout), saying so.
    if r == 0:
        del os.environ["JACCL_JOB_TOKEN"]
    try:
        dist.init_process_group("jaccl", timeout=timedelta(seconds=60))
        one_sided = None
    except dist.DistBackendError as e:
        one_sided = [type(e.__cause__).__name__, str(e)]
    report(
        {
            "sum": t.tolist(),
            "passed_on": "JACCL_JOB_TOKEN" in given,
            "sealed": len(sealed),
            "failed": failed,
            "one_sided": one_sided,
        }
    )


def shared_store():
    """A job of 2 plain processes (no launcher: RANK, WORLD_SIZE; argv: store file, marker
    file) over a file store, which runs until the marker file exists; the test starts another
    such job over the same file meanwhile, with the same identity."""
    path, marker = sys.argv[2], sys.argv[3]
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        dist.init_process_group("jaccl", init_method="file://" + path, rank=r, world_size=n, timeout=timedelta(seconds=20))
    except dist.DistBackendError as e:
        report({"failed": [type(e.__cause__).__name__, str(e)]})
        return
    t = torch.ones(2)
    dist.all_reduce(t)
    report({"sum": t.tolist()})
    while not os.path.exists(marker):
        time.sleep(0.05)
    dist.all_reduce(t)


def poll(work):
    """Polls `work` until it completes (at most 30 s); whether it did."""
    deadline = time.monotonic() + 30
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    return work.is_completed()


def hardening():
    """3 ranks: what a Work reports when polled, PREMUL_SUM's reduce, rings of 80 MiB,
    messages differing by a whole piece, polls from another thread, Work.wait's timeout, new_group's timeout, abort and shutdown from a watchdog thread,
    and a tensor changed while in flight."""
    import threading

    r, n = dist.get_rank(), dist.get_world_size()
    left, right = (r - 1) % n, (r + 1) % n
    wrong = []

    def check(what, got, expect):
        if not torch.equal(got, expect):
            wrong.append(f"{what}: {got.flatten().tolist()[:6]} != {expect.flatten().tolist()[:6]}")

    # Polled, not waited: every output written once is_completed() says so.
    outs = [torch.zeros(4) for _ in range(n)]
    w = dist.all_gather(outs, torch.full((4,), r + 1.0), async_op=True)
    poll(w)
    check("polled all_gather", torch.stack(outs), torch.arange(1.0, n + 1).repeat_interleave(4).reshape(n, 4))
    gathered = [torch.zeros(2) for _ in range(n)] if r == 0 else None
    w = dist.gather(torch.full((2,), float(r)), gathered, dst=0, async_op=True)
    poll(w)
    if r == 0:
        check("polled gather", torch.stack(gathered), torch.arange(float(n)).repeat_interleave(2).reshape(n, 2))
    recv = [torch.zeros(1) for _ in range(n)]
    w = dist.all_to_all(recv, [torch.full((1,), float(r * 10 + d)) for d in range(n)], async_op=True)
    poll(w)
    check("polled all_to_all", torch.cat(recv), torch.tensor([float(s * 10 + r) for s in range(n)]))
    view = torch.zeros(n, 6)[:, ::2]
    w = dist.all_gather_into_tensor(view, torch.full((3,), float(r)), async_op=True)
    poll(w)
    check("polled non-contiguous output", view, torch.arange(float(n)).repeat_interleave(3).reshape(n, 3))
    got = torch.zeros(3, 2).t()
    w = dist.irecv(got, src=left)
    dist.isend(torch.arange(6.0).reshape(2, 3) + r, dst=right)
    poll(w)
    check("polled irecv into a non-contiguous tensor", got, torch.arange(6.0).reshape(2, 3) + left)

    # A failed operation's exception, polled without a wait (ranks 0 and 1 disagree on the type).
    pair = dist.new_group([0, 1])
    if r < 2:
        w = dist.all_reduce(torch.ones(2, dtype=torch.float32 if r == 0 else torch.int64), group=pair, async_op=True)
        deadline = time.monotonic() + 30
        while w.exception() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        cause = getattr(w.exception(), "__cause__", None)
        if type(cause).__name__ != "Mismatch" or not w.is_completed() or w.is_success():
            wrong.append(f"exception() of a failed operation: {w.exception()!r}")

    # PREMUL_SUM reduce: the root gets the scaled sum; the others' inputs stay as they were.
    t = torch.full((5,), float(r + 1))
    dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(0.5))
    check("premul_sum reduce", t, torch.full((5,), sum(0.5 * (q + 1) for q in range(n)) if r == 0 else float(r + 1)))

    # Rings of 80 MiB, receives first and sends first (above the 64 MiB a rank reads ahead).
    big = 20 << 20
    for receive_first in (True, False):
        got = torch.empty(big)
        ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, torch.full((big,), float(r)), right)]
        for w in dist.batch_isend_irecv(ops if receive_first else ops[::-1]):
            w.wait()
        check(f"80 MiB ring, receives first {receive_first}", got[:: 1 << 16], torch.full((320,), float(left)))
    del got, ops

    # Messages that differ by a whole 16 MiB piece (32 MiB sent, 16 MiB received): the
    # receiver fails at the first piece, which agrees, rather than taking half the message.
    apart = dist.new_group([0, 1], timeout=timedelta(seconds=30))
    if r == 0:
        w = dist.isend(torch.ones(8 << 20), dst=1, group=apart)
        try:
            w.wait()
        except dist.DistBackendError:
            pass  # rank 1 left the group after its failed receive: either way is right
    elif r == 1:
        try:
            dist.recv(torch.zeros(4 << 20), src=0, group=apart)
            wrong.append("messages differing by a piece: no error")
        except dist.DistBackendError as e:
            if type(e.__cause__).__name__ != "Mismatch" or "a piece of a message of 8388608" not in str(e):
                wrong.append(f"messages differing by a piece: {e}")
    if r < 2:
        dist.destroy_process_group(apart)

    # Another thread polling a receive before this one posts the send: the receive must still
    # go to jaccl after the send (else every rank waits in its receive: Deadlock).
    got = torch.zeros(2)
    w = dist.irecv(got, src=left)
    stop = threading.Event()

    def poller():
        while not stop.is_set():
            w.is_completed()
            w.exception()

    thread = threading.Thread(target=poller)
    thread.start()
    time.sleep(0.2)
    dist.isend(torch.full((2,), float(r)), dst=right)
    try:
        w.wait()
        check("receive polled from another thread", got, torch.full((2,), float(left)))
    except dist.DistBackendError as e:
        wrong.append(f"receive polled from another thread: {e}")
    stop.set()
    thread.join()

    # Work.wait with a timeout: rank 1 sends only once rank 0's wait has timed out (told
    # through a store), so that wait raises as Gloo's does, and a later wait gets the message.
    store = dist.TCPStore("127.0.0.1", int(os.environ["TEST_SPARE_PORT"]), n, r == 0)
    if r == 0:
        got = torch.zeros(3)
        w = dist.irecv(got, src=1)
        try:
            w.wait(timeout=timedelta(milliseconds=300))
            wrong.append("Work.wait(timeout): no error")
        except RuntimeError as e:
            if type(e) is not RuntimeError or "timed out" not in str(e):
                wrong.append(f"Work.wait(timeout): {type(e).__name__}: {e}")
        store.set("wait timed out", "")
        w.wait()
        check("a receive waited for again after a timeout", got, torch.full((3,), 1.0))
    elif r == 1:
        store.wait(["wait timed out"], timedelta(seconds=60))
        dist.send(torch.full((3,), 1.0), dst=0)

    # new_group's timeout: rank 1 never joins rank 0's all-reduce.
    short = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    if r == 0:
        try:
            dist.all_reduce(torch.ones(1), group=short)
            wrong.append("new_group timeout: no error")
        except dist.DistBackendError as e:
            if type(e.__cause__).__name__ != "Timeout" or "2s" not in str(e):
                wrong.append(f"new_group timeout: {e}")

    # abort() and shutdown() from a watchdog thread stop a call stuck on a peer that never
    # comes (rank 1), blocking and in Work.wait(), within the groups' 120 s timeout.
    stuck = [dist.new_group([0, 1], timeout=timedelta(seconds=120)) for _ in range(2)]
    if r == 0:
        for group, how, asynchronous in ((stuck[0], "abort", False), (stuck[1], "shutdown", True)):
            threading.Timer(1.0, getattr(group, how)).start()
            try:
                w = dist.all_reduce(torch.ones(1), group=group, async_op=asynchronous)
                if asynchronous:
                    w.wait()
                wrong.append(f"{how}: no error")
            except dist.DistBackendError as e:
                cause = e.__cause__
                if isinstance(cause, TimeoutError) or ("aborted" if how == "abort" else "closed") not in str(e):
                    wrong.append(f"{how}: {type(cause).__name__}: {e}")

    # new_group's timeout is also its start-up's: rank 0 forms the group alone and fails
    # within 2 s; rank 1 comes only then (or after 15 s: with the parent's 60 s start-up
    # timeout, the group would then form) and fails too, rank 0 being gone.
    if r == 1:
        try:
            store.wait(["rank 0 failed"], timedelta(seconds=15))
        except RuntimeError:
            pass
    try:
        dist.new_group([0, 1], timeout=timedelta(seconds=2))
        if r < 2:
            wrong.append(f"new_group start-up timeout: no error on rank {r}")
    except dist.DistBackendError as e:
        if r == 0 and (type(e.__cause__).__name__ != "BootstrapError" or "timed out" not in str(e)):
            wrong.append(f"new_group start-up timeout: {e}")
    if r == 0:
        store.set("rank 0 failed", "")

    # A tensor set_() to another storage while its all-reduce is in flight: the operation
    # works on the old storage (kept alive) and its wait says so.
    t = torch.ones(4)
    if r != 0:
        time.sleep(0.3)
    w = dist.all_reduce(t, async_op=True)
    if r == 0:
        t.set_(torch.zeros(8))
    try:
        w.wait()
        if r == 0:
            wrong.append("set_() in flight: no error")
    except RuntimeError as e:
        if r != 0 or "set_()" not in str(e):
            wrong.append(f"set_() in flight: {e}")
    dist.barrier()
    report({"wrong": wrong})


def any_source():
    """Receives from any source (3 ranks): ranks 1 and 2 each send rank 0 two messages, in
    varied orders, which rank 0 takes with recv and irecv without a source (each sender
    twice, its data, in its order); messages of 40 MiB (in pieces) from any source, all
    receives posted before the first wait; receives with and without a source interleaved
    (each message goes to the first posted that can take it); a ring whose receives are from
    any source; a differing tag is a Mismatch."""
    r, n = dist.get_rank(), dist.get_world_size()
    wrong = []
    if r == 0:
        got = []
        for k in range(2 * (n - 1)):
            t = torch.full((1000,), -1, dtype=torch.int64)
            if k % 2 == 0:
                sender = dist.recv(t, tag=3)
            else:
                w = dist.irecv(t, tag=3)
                w.wait()
                sender = w._source_rank()
            got.append((sender, int(t[0])))
            if not bool((t == t[0]).all()):
                wrong.append(f"message {k} from {sender}: not whole")
        for q in range(1, n):
            if [v for s, v in got if s == q] != [q * 10, q * 10 + 1]:
                wrong.append(f"any source: {got}")
    else:
        time.sleep(0.05 * (n - r))
        for k in range(2):
            dist.send(torch.full((1000,), r * 10 + k, dtype=torch.int64), dst=0, tag=3)
    dist.barrier()

    big = 10 << 20  # 40 MiB of float32: 3 pieces
    if r == 0:
        inbox = [torch.empty(big) for _ in range(n - 1)]
        works = [dist.irecv(t) for t in inbox]
        senders = []
        for w, t in zip(works, inbox):
            w.wait()
            senders.append(w.source_rank())
            if not torch.equal(t[:: 1 << 16], torch.full((160,), float(senders[-1]))):
                wrong.append(f"40 MiB from {senders[-1]}: {t[:: 1 << 20].tolist()}")
        if sorted(senders) != list(range(1, n)):
            wrong.append(f"40 MiB senders: {senders}")
    else:
        dist.send(torch.full((big,), float(r)), dst=0)
    dist.barrier()

    # Rank 1 sends three 20 MiB messages (2 pieces each); rank 0 posts a receive from rank 1,
    # one from any source, one from rank 1: they take the messages in that order.
    half = 5 << 20
    if r == 0:
        a, b, c = torch.empty(half), torch.empty(half), torch.empty(half)
        works = [dist.irecv(a, src=1), dist.irecv(b), dist.irecv(c, src=1)]
        for w in works:
            w.wait()
        got = [a[:: 1 << 18].unique().tolist(), b[:: 1 << 18].unique().tolist(), c[:: 1 << 18].unique().tolist()]
        if got != [[1.0], [2.0], [3.0]] or works[1].source_rank() != 1:
            wrong.append(f"receives interleaved: {got}, from {works[1].source_rank()}")
    elif r == 1:
        for v in (1.0, 2.0, 3.0):
            dist.send(torch.full((half,), v), dst=0)
    dist.barrier()

    # A ring of 40 MiB messages, each rank receiving from any source.
    got = torch.empty(big)
    works = [dist.irecv(got), dist.isend(torch.full((big,), float(r)), dst=(r + 1) % n)]
    for w in works:
        w.wait()
    left = (r - 1) % n
    if works[0].source_rank() != left or not torch.equal(got[:: 1 << 16], torch.full((160,), float(left))):
        wrong.append(f"ring from any source: {works[0].source_rank()}, {got[:: 1 << 20].tolist()}")
    del got, works

    # A tag that differs: Mismatch (on a group of its own, which it poisons).
    pair = dist.new_group([0, 2])
    if r == 0:
        try:
            dist.recv(torch.empty(2), group=pair, tag=7)
            wrong.append("differing tag: no error")
        except dist.DistBackendError as e:
            if type(e.__cause__).__name__ != "Mismatch" or "with tag 8" not in str(e):
                wrong.append(f"differing tag: {e}")
    elif r == 2:
        dist.send(torch.ones(2), dst=0, group=pair, tag=8)
    dist.barrier()
    report({"wrong": wrong})


def coalesced_and_sparse():
    """all_gather_coalesced in torch's layout (3 ranks), and all-reduce of sparse COO tensors:
    the sum, the same bits on every rank; sparse tensors in other operations are refused."""
    r, n = dist.get_rank(), dist.get_world_size()
    wrong = []
    # output_lists[q][k] is rank q's input k: shapes that differ by k, empty ones among them.
    shapes = [(2, 3), (0,), (4,), (1, 1, 5)]
    inputs = [torch.full(s, float(r * 10 + k)) for k, s in enumerate(shapes)]
    outputs = [[torch.full(s, -1.0) for s in shapes] for _ in range(n)]
    for asynchronous in (False, True):
        w = dist.all_gather_coalesced(outputs, inputs, async_op=asynchronous)
        if asynchronous:
            w.wait()
        for q in range(n):
            for k, s in enumerate(shapes):
                if not torch.equal(outputs[q][k], torch.full(s, float(q * 10 + k))):
                    wrong.append(f"all_gather_coalesced [{q}][{k}]: {outputs[q][k].tolist()}")

    def sparse(rank, dense_dims):
        """Rank `rank`'s tensor: rows 0..rank of an 8 x 3 (x 2 per dense dimension) tensor, row
        1 twice (uncoalesced), values with rounding; rank 0's has no non-zeros."""
        g = torch.Generator().manual_seed(rank)
        rows = [i for i in range(rank + 1) if rank > 0] + ([1] if rank > 0 else [])
        indices = torch.tensor([rows, [(i * 2) % 3 for i in range(len(rows))]], dtype=torch.int64)
        values = torch.rand((len(rows),) + (2,) * dense_dims, generator=g, dtype=torch.float64) / 3
        return torch.sparse_coo_tensor(indices, values, (8, 3) + (2,) * dense_dims)

    for dense_dims in (0, 1):
        for asynchronous in (False, True):
            t = sparse(r, dense_dims)
            w = dist.all_reduce(t, async_op=asynchronous)
            if asynchronous:
                w.wait()
            expect = sum(sparse(q, dense_dims).to_dense() for q in range(n))
            if not t.is_sparse or not torch.allclose(t.to_dense(), expect, rtol=0, atol=1e-12):
                wrong.append(f"sparse all_reduce {dense_dims} dense dims: {t}")
            everyone = [torch.empty_like(t.to_dense()) for _ in range(n)]
            dist.all_gather(everyone, t.to_dense())
            if not all(torch.equal(e.view(torch.int64), everyone[0].view(torch.int64)) for e in everyone):
                wrong.append(f"sparse all_reduce {dense_dims} dense dims: bits differ between ranks")
    for name, call in [
        ("broadcast", lambda t: dist.broadcast(t, src=0)),
        ("all_gather", lambda t: dist.all_gather([torch.empty(8, 3, dtype=t.dtype) for _ in range(n)], t)),
        ("all_reduce max", lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX)),
        ("reduce", lambda t: dist.reduce(t, dst=0)),
    ]:
        try:
            call(sparse(r, 0))
            wrong.append(f"sparse {name}: no error")
        except ValueError as e:
            if "sparse" not in str(e) and "dense" not in str(e):
                wrong.append(f"sparse {name}: {e}")
    dist.barrier()
    report({"wrong": wrong})


def cycles():
    """100 sub-groups made, used (blocking, async with a future, point to point) and destroyed
    with the cyclic garbage collector off (2 ranks): no jaccl thread, file descriptor or
    heartbeat is left once the world group is destroyed too."""
    import gc
    import threading

    def jaccl_threads():
        names = [t.name for t in threading.enumerate()]
        for comm in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{comm}/comm").read().strip())
            except OSError:
                pass
        return sorted(n for n in names if "jaccl" in n)

    def settled():
        """Thread names and fd count once jaccl's threads are gone (they end as the groups
        close: waited for, up to 10 s)."""
        deadline = time.monotonic() + 10
        while jaccl_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return jaccl_threads(), sorted(fds)

    def groups(count):
        dist.init_process_group("jaccl", timeout=timedelta(seconds=60))
        r = dist.get_rank()
        for _ in range(count):
            g = dist.new_group([0, 1])
            t = torch.ones(2)
            dist.all_reduce(t, group=g)
            dist.all_reduce(t, group=g, async_op=True).get_future().wait()
            got = torch.empty(1)
            for w in [dist.irecv(got, src=1 - r, group=g), dist.isend(torch.ones(1), dst=1 - r, group=g)]:
                w.wait()
            dist.destroy_process_group(g)
        dist.destroy_process_group()
        return t

    groups(1)  # what torch itself keeps from then on (a store connection) is in `before`
    before = settled()
    gc.disable()
    t = groups(100)
    after = settled()
    gc.enable()
    report({"before": before, "after": after, "sum": t.tolist()})


def again():
    """Groups made again in one process (2 ranks): jaccl, then a gloo world with a jaccl group
    inside, then jaccl three more times (by name, device-qualified, bound to a device): torch
    gives each default group the same store prefix. (Gloo made twice in one process fails now
    and then by itself, reading the last one's addresses: so once.)"""
    sums = []

    def one_job(*args, **kwargs):
        dist.init_process_group(*args, **kwargs)
        t = torch.ones(2)
        dist.all_reduce(t)
        sums.append(t.tolist())

    one_job("jaccl")
    dist.destroy_process_group()
    one_job("gloo")
    inside = dist.new_group(backend="jaccl")
    t = torch.ones(2)
    dist.all_reduce(t, group=inside)
    sums.append(t.tolist() + [dist.get_backend(inside)])
    dist.destroy_process_group()
    for args, kwargs in [(("jaccl",), {}), (("cpu:jaccl",), {}), (("jaccl",), {"device_id": torch.device("cpu", 0)})]:
        try:
            one_job(*args, **kwargs)
        except ValueError as e:  # torch 2.10 binds groups to accelerators only
            if "accelerator" not in str(e):
                raise
            one_job(*args)
        dist.destroy_process_group()
    report({"sums": sums})


def lose_a_rank():
    """Rank 1 dies during an all-reduce: the others raise DistBackendError, caused by a
    jaccl PeerLost that names rank 1."""
    r = dist.get_rank()
    t = torch.ones(1 << 20)
    dist.all_reduce(t)
    if r == 1:
        os._exit(3)
    try:
        for _ in range(1000):
            dist.all_reduce(t)
        report({"error": None})
    except dist.DistBackendError as e:
        cause = e.__cause__
        report({"error": type(e).__name__, "cause": type(cause).__name__, "peer": getattr(cause, "peer", None), "message": str(e)})
    os._exit(0)


def shrink_after_a_kill():
    """Rank 0 (jaccl's coordinator and heartbeat hub) is killed mid-training: the others'
    all-reduce raises, torch's own shrink_group says to use jaccl's, and
    jaccl.torch.shrink_group gives them a default group of the survivors, on which an
    all-reduce, a new group and a barrier work."""
    import jaccl.torch

    r = dist.get_rank()
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if r == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            dist.all_reduce(t)
    except dist.DistBackendError as e:
        caught = type(e.__cause__).__name__
    try:
        dist.shrink_group([0])
        torch_says = None
    except TypeError as e:
        torch_says = "jaccl.torch.shrink_group" in str(e)
    pg = jaccl.torch.shrink_group([0])
    t = torch.full((4,), float(r))
    dist.all_reduce(t)
    sub = dist.new_group([0, 1])
    u = torch.ones(1)
    if sub is not None and dist.get_rank() in (0, 1):
        dist.all_reduce(u, group=sub)
    dist.barrier()
    report({"caught": caught, "torch_says": torch_says, "rank": dist.get_rank(), "size": dist.get_world_size(),
            "ranks": dist.get_process_group_ranks(pg), "sum": t.tolist(), "sub": u.tolist(), "default": pg is dist.group.WORLD})
    os._exit(0)


def exit_while_completing():
    """Each rank exits without destroying its group while the thread that completes futures
    may still run a callback of one: the interpreter waits for it instead of aborting
    (SIGABRT)."""
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future()
    fut.then(lambda f: time.sleep(0.5) or f.value())
    fut.wait()
    report({"sum": fut.value()[0].tolist()})
    sys.exit(0)  # as a script that ends without destroy_process_group


if __name__ == "__main__":
    case = sys.argv[1]
    if case not in ("init_methods", "again", "user_token", "shared_store", "cycles"):
        dist.init_process_group("jaccl", timeout=timedelta(seconds=60))
    {"collectives": collectives, "groups": groups, "init_methods": init_methods, "again": again,
     "lose_a_rank": lose_a_rank, "user_token": user_token, "shared_store": shared_store,
     "hardening": hardening, "cycles": cycles, "any_source": any_source,
     "coalesced_and_sparse": coalesced_and_sparse, "exit_while_completing": exit_while_completing,
     "shrink_after_a_kill": shrink_after_a_kill}[case]()
    if dist.is_initialized():
        dist.destroy_process_group()
