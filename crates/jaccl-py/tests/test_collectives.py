"""Every collective of `import jaccl` on real jobs of 1, 2 and 4 processes, against numpy
references, with bit-identical results on every rank."""

import pytest

# The element types and reference reductions, shared by the ranks' code and the tests.
COMMON = """
import hashlib
import ml_dtypes
DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64]

def value(dt, rank, n, salt=0):
    # Small integers (and i for complex): sums are exact in any order.
    v = (np.arange(n) * 7 + rank * 3 + salt) % 11 - 5
    dt = np.dtype(dt)
    if dt == np.bool_:
        return v > 0
    if dt.kind == "u":
        v = np.abs(v)
    if dt.kind == "c":
        return (v + 1j * (v % 3)).astype(dt)
    return v.astype(dt)

def reference(arrays, op):
    a = np.stack(arrays)
    dt = a.dtype
    if dt == np.bool_:
        return {"sum": a.any(0), "max": a.any(0), "min": a.all(0)}[op]
    if op == "sum":
        wide = np.complex128 if dt.kind == "c" else np.float64
        return a.astype(wide).sum(0).astype(dt)
    if dt.kind == "c":
        # jaccl orders complex numbers by (re, im), as numpy's maximum and minimum do.
        f = np.maximum if op == "max" else np.minimum
        return f.reduce(a, axis=0)
    f = np.max if op == "max" else np.min
    return f(a.astype(np.float64), axis=0).astype(dt)

def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest()

def check(got, expect, what):
    assert got.dtype == expect.dtype and got.shape == expect.shape, (what, got.dtype, got.shape)
    assert got.view(np.uint8).tobytes() == expect.view(np.uint8).tobytes(), (what, got, expect)
"""


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_dtype_and_op_matches_numpy_on_every_rank(run, size):
    results = run(
        size,
        COMMON
        + """
g = jaccl.init()
digests = []
for dt in DTYPES:
    for n in (0, 1, 37, 70_001):
        for op in ("sum", "max", "min"):
            got = g.all_reduce(value(dt, g.rank, n), op)
            expect = reference([value(dt, r, n) for r in range(g.size)], op)
            check(got, expect, (np.dtype(dt).name, n, op))
            digests.append(digest(got))
report(digests)
""",
    )
    assert all(r == results[0] for r in results), "ranks differ"


@pytest.mark.parametrize("size", [1, 2, 4])
def test_all_gather_and_reduce_scatter_shapes_and_values(run, size):
    run(
        size,
        COMMON
        + """
g = jaccl.init()
for dt in DTYPES:
    for n in (0, 3, 20_000):
        x = value(dt, g.rank, n).reshape(-1, 1)
        got = g.all_gather(x)
        expect = np.stack([value(dt, r, n).reshape(-1, 1) for r in range(g.size)])
        check(got, expect, ("all_gather", np.dtype(dt).name, n))
        for op in ("sum", "max", "min"):
            x = value(dt, g.rank, g.size * n * 2).reshape(g.size * n, 2)
            got = g.reduce_scatter(x, op)
            whole = reference([value(dt, r, g.size * n * 2).reshape(g.size * n, 2)
                               for r in range(g.size)], op)
            check(got, whole[g.rank * n:(g.rank + 1) * n], ("reduce_scatter", np.dtype(dt).name, n, op))
report("ok")
""",
    )


@pytest.mark.parametrize("size", [2, 4])
def test_float_sums_are_bit_identical_across_ranks(run, size):
    # Values whose sum depends on the order of additions: every rank must still agree.
    results = run(
        size,
        COMMON
        + """
g = jaccl.init()
rng = np.random.default_rng(g.rank)
out = []
for n in (5, 1000, 300_000):
    for dt in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dt)
        out.append(digest(g.all_sum(x)))
report(out)
""",
    )
    assert all(r == results[0] for r in results)


def test_out_and_in_place(run):
    run(
        2,
        """
g = jaccl.init()
x = np.arange(10, dtype=np.float32) + g.rank
out = np.zeros_like(x)
r = g.all_sum(x, out=out)
assert r is out and (out == 2 * np.arange(10) + 1).all()
y = x.copy()
assert g.all_max(y, out=y) is y and (y == np.arange(10) + 1).all()
gathered = np.zeros((2, 10), np.float32)
assert g.all_gather(x, out=gathered) is gathered and (gathered[1] == np.arange(10) + 1).all()
block = np.zeros(5, np.float32)
assert g.reduce_scatter(x, out=block) is block
assert (block == (2 * np.arange(10) + 1)[g.rank * 5:(g.rank + 1) * 5]).all()
# An output overlapping the input (not the same array) still gives the right result.
z = np.arange(20, dtype=np.int32)
g.all_gather(z[:10], out=z.reshape(2, 10))
assert (z == np.tile(np.arange(10), 2)).all(), z
report("ok")
""",
    )


def test_bad_arguments_are_invalid_before_anything_is_sent(run):
    results = run(
        2,
        """
g = jaccl.init()
x = np.ones(8, np.float32)
bad = {
    "wrong out dtype": lambda: g.all_sum(x, out=np.zeros(8, np.float64)),
    "wrong out shape": lambda: g.all_sum(x, out=np.zeros(9, np.float32)),
    "read-only out": lambda: g.all_sum(x, out=np.frombuffer(bytes(32), np.float32)),
    "non-contiguous": lambda: g.all_sum(np.ones(16, np.float32)[::2]),
    "unsupported dtype": lambda: g.all_sum(np.ones(4, np.complex128)),
    "other byte order": lambda: g.all_sum(np.ones(4, np.dtype(np.float32).newbyteorder())),
    "object": lambda: g.all_sum([1, 2, 3]),
    "op": lambda: g.all_reduce(x, op="median"),
    "bitwise on floats": lambda: g.all_reduce(x, op="band"),
    "avg of bools": lambda: g.all_reduce(np.ones(3, np.bool_), op="avg"),
    "root out of range": lambda: g.broadcast(x, root=2),
    "counts of another size": lambda: g.all_gather_v(x, [8]),
    "counts that do not add up": lambda: g.all_to_all_v(x, [4, 3], [4, 4]),
    "all_to_all blocks": lambda: g.all_to_all(np.ones(3, np.float32)),
    "gather out": lambda: g.all_gather(x, out=np.zeros((3, 8), np.float32)),
    "scatter blocks": lambda: g.reduce_scatter(np.ones(3, np.float32)),
    "send to self": lambda: g.send(x, g.rank),
    "send to nobody": lambda: g.send(x, 7),
    "negative rank": lambda: g.recv(x, -1),
    "negative tag": lambda: g.send(x, 1 - g.rank, tag=-1),
    "tag beyond 32 bits": lambda: g.recv(x, 1 - g.rank, tag=1 << 32),
    "recv read-only": lambda: g.recv(np.frombuffer(bytes(32), np.float32), 1 - g.rank),
    "recv_any read-only": lambda: g.recv_any(np.frombuffer(bytes(32), np.float32)),
    "recv_any tag": lambda: g.recv_any(x, tag=-1),
    # Ints beyond what the native calls take: InvalidArgument, not OverflowError.
    "reduce root beyond 64 bits": lambda: g.reduce(x, root=2**64),
    "broadcast root beyond 64 bits": lambda: g.broadcast(x, root=2**64),
    "split color beyond 32 bits": lambda: g.split(2**40),
    "split negative key": lambda: g.split(0, key=-5),
    "subgroup rank beyond 64 bits": lambda: g.subgroup([0, 2**70]),
    "all_gather_v count beyond 64 bits": lambda: g.all_gather_v(x, [2**70, 8]),
    "reduce_scatter_v float count": lambda: g.reduce_scatter_v(x, [4.5, 3.5]),
}
seen = {}
for name, call in bad.items():
    try:
        call()
        seen[name] = "no error"
    except jaccl.InvalidArgument as e:
        assert isinstance(e, ValueError) and isinstance(e, jaccl.Error)
        seen[name] = "InvalidArgument"
# The group is still usable.
assert (g.all_sum(x) == 2).all()
g.barrier()
report(seen)
""",
    )
    for seen in results:
        assert set(seen[0].values()) == {"InvalidArgument"}, seen


def test_send_and_recv_around_the_ring_and_across_the_mesh(run):
    code = """
g = jaccl.init({settings})
n = g.size
right, left = (g.rank + 1) % n, (g.rank - 1) % n
for length in (0, 1, 5000, 300_001):
    mine = np.arange(length, dtype=np.int32) * (g.rank + 1)
    got = np.empty(length, np.int32)
    if g.rank % 2 == 0:
        g.send(mine, right); g.recv(got, left)
    else:
        g.recv(got, left); g.send(mine, right)
    assert (got == np.arange(length, dtype=np.int32) * (left + 1)).all()
# Every ordered pair, in one global order, on either topology (links to ranks that are not
# neighbours are made on first use without the mesh).
for a in range(n):
    for b in range(n):
        if a == b:
            continue
        data = np.full(100, a * 10 + b, np.int16)
        tag = a * 100_000 + b  # tagged like torch's send/recv (above 2^16 too)
        if g.rank == a:
            g.send(data, b, tag=tag)
        elif g.rank == b:
            assert (g.recv(np.empty(100, np.int16), a, tag=tag) == data).all()
report([g.topology, sorted(p for p, _ in g.transport)])
"""
    everyone = lambda r: sorted(set(range(4)) - {r})  # noqa: E731
    got = run(4, code.format(settings='transport="tcp"'))
    assert got == [[["ring", everyone(r)]] for r in range(4)], got
    got = run(4, code.format(settings='topology="mesh", transport="tcp"'))
    assert got == [[["mesh", everyone(r)]] for r in range(4)], got


def test_recv_any_takes_every_sender_once_in_order_with_its_data(run):
    # Ranks 1-3 each send rank 0 two messages, in an order of their own; rank 0 receives all six from any source, blocking and async_op, and checks
    # each sender, its data and the order of its messages. Then a tag that differs is a
    # Mismatch naming the sender's tag.
    code = """
g = jaccl.init({settings}, timeout="60s")
if g.rank == 0:
    got = []
    for k in range(6):
        out = np.empty(1000, np.int64)
        if k % 2:
            work = g.recv_any(out, async_op=True, tag=5)
            sender = work.result()
            assert work.source == sender
        else:
            sender = g.recv_any(out, tag=5)
        got.append([sender, int(out[0]), bool((out == out[0]).all())])
    g.send(np.ones(1, np.int64), 2)  # (no collective here: recv_any would read its header)
    try:
        g.recv_any(np.empty(3, np.int64), tag=6)
        got.append("no error")
    except jaccl.Mismatch as e:
        got.append([e.peer, "with tag 9" in str(e)])
    report(got)
else:
    import time
    time.sleep(0.05 * (3 - g.rank))  # the ranks' first messages arrive in varied orders
    for k in range(2):
        g.send(np.full(1000, g.rank * 10 + k, np.int64), 0, tag=5)
    if g.rank == 2:
        g.recv(np.empty(1, np.int64), 0)
        g.send(np.zeros(3, np.int64), 0, tag=9)
"""
    for settings in ('transport="tcp"', 'transport="auto"'):
        results = run(4, code.format(settings=settings))
        got = results[0][0]
        received, mismatch = got[:6], got[6]
        assert sorted(s for s, _, _ in received) == [1, 1, 2, 2, 3, 3], got
        for sender, value, whole in received:
            assert whole and value // 10 == sender, got
        for q in (1, 2, 3):  # a sender's messages in the order it sent them
            assert [v for s, v, _ in received if s == q] == [q * 10, q * 10 + 1], got
        assert mismatch == [2, True], got


def test_dlpack_and_buffer_inputs(run):
    run(
        2,
        """
class Producer:
    # Only DLPack: the path PyTorch tensors on other devices and other libraries take.
    def __init__(self, a):
        self.a = a
    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)
    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

g = jaccl.init()
x = np.arange(6, dtype=np.float32) + g.rank
assert (g.all_sum(Producer(x)) == 2 * np.arange(6) + 1).all()
import array
assert (g.all_sum(array.array("i", [1, 2, 3])) == [2, 4, 6]).all()
assert (g.all_sum(b"\\x01\\x02") == [2, 4]).all()
buf = bytearray(4)
g.recv(buf, 1 - g.rank) if g.rank else g.send(np.frombuffer(b"abcd", np.uint8), 1)
report(bytes(buf).decode() if g.rank else "sent")
""",
    )


def test_torch_cpu_tensors(run):
    pytest.importorskip("torch")
    run(
        2,
        """
import torch
g = jaccl.init()
t = torch.arange(8, dtype=torch.float32) + g.rank
out = torch.zeros(8)
assert g.all_sum(t, out=out) is out and torch.equal(out, 2 * torch.arange(8.0) + 1)
b = torch.ones(4, dtype=torch.bfloat16)
assert (g.all_sum(b).astype(np.float32) == 2).all()
g.all_sum(t.requires_grad_(), out=t.detach())
report("ok")
""",
    )


def test_init_settings_and_properties(run):
    results = run(
        3,
        """
g = jaccl.init(wires=2, transport="tcp", timeout="30s", link="10Gb/s,20us")
report([g.rank, g.size, g.topology, g.transport, repr(g)])
try:
    jaccl.init(wires="lots")
except jaccl.ConfigError as e:
    report(str(e))
try:
    jaccl.init(link="fast")
except jaccl.ConfigError as e:
    report(str(e))
""",
    )
    for rank, (props, error, link_error) in enumerate(results):
        assert "JACCL_LINK" in link_error and "fast" in link_error
        assert props[:3] == [rank, 3, "ring"]
        assert props[3] == [[(rank - 1) % 3, "tcp"], [(rank + 1) % 3, "tcp"]]
        assert "JACCL_WIRES" in error and "lots" in error


def test_hosts_as_every_rank_knows_them(run):
    """Pretend hosts a, b, a, b, a: every rank holds the same hosts, numbered by their lowest
    rank, and its own place on one."""
    results = run(
        5,
        """
import os
g = jaccl.init(host_id="ab"[int(os.environ["JACCL_RANK"]) % 2])
report([g.hosts, g.host, g.local_rank, g.local_size])
""",
    )
    for rank, [(hosts, host, local_rank, local_size)] in enumerate(results):
        assert hosts == [[0, 2, 4], [1, 3]]
        assert (host, local_rank, local_size) == (rank % 2, rank // 2, 3 - rank % 2)
