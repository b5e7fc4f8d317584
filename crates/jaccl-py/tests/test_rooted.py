"""Broadcast, reduce, gather, scatter, all-to-all (even and uneven), all-gather-v,
reduce-scatter-v and the reductions beyond sum/max/min, on real jobs of 1, 2, 3 and 4
processes, against numpy references."""

import pytest

from test_collectives import COMMON

# References for the reductions that test_collectives' `reference` does not cover.
MORE = """
def reference_op(arrays, op):
    a = np.stack(arrays)
    dt = a.dtype
    if op in ("sum", "max", "min"):
        return reference(arrays, op)
    if op == "prod":
        if dt == np.bool_:
            return a.all(0)
        return np.multiply.reduce(a, axis=0, dtype=dt)
    if op == "avg":
        if dt.kind in "iu":
            s = np.add.reduce(a, axis=0, dtype=dt)
            # Toward zero, as jaccl documents.
            return (np.sign(s) * (np.abs(s.astype(np.int64)) // len(arrays))).astype(dt)
        s = np.add.reduce(a.astype(np.complex128 if dt.kind == "c" else np.float64), axis=0)
        n = np.float32(len(arrays))
        if dt.kind == "c":
            # Each part divided by the ranks (not a complex division).
            s = s.astype(dt)
            return (s.real / n + 1j * (s.imag / n)).astype(dt)
        return (s.astype(dt) / np.array(n)).astype(dt)
    f = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    return f.reduce(a, axis=0)

def factors(dt, rank, n):
    # Values whose products are exact and order-independent: 0, 1 and 2; for complex, parts of
    # 1 to 3 (never zero, so no zero part of a product can take a sign from the order).
    v = (np.arange(n) * 7 + rank * 3) % 11
    if np.dtype(dt).kind == "c":
        return ((v % 3 + 1) * np.where(v % 2, -1, 1) + 1j * ((v + 1) % 3 + 1)).astype(dt)
    if np.dtype(dt) == np.bool_:
        return v % 5 != 0
    return (v % 3).astype(dt)

def ops_for(dt):
    dt = np.dtype(dt)
    ops = ["sum", "max", "min", "prod"]
    if dt != np.bool_:
        ops.append("avg")
    if dt.kind in "biu":
        ops += ["band", "bor", "bxor"]
    return ops
"""


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_rooted_collectives_from_every_root(run, size):
    run(
        size,
        COMMON
        + MORE
        + """
g = jaccl.init()
for dt in DTYPES:
    for n in (0, 5, 30_001):
        for root in range(g.size):
            x = value(dt, g.rank, n).reshape(-1, 1)
            got = g.broadcast(x, root)
            check(got, value(dt, root, n).reshape(-1, 1), ("broadcast", root))
            y = x.copy()
            assert g.broadcast(y, root=root, out=y) is y
            check(y, got, ("broadcast in place", root))

            got = g.gather(x, root)
            if g.rank == root:
                expect = np.stack([value(dt, r, n).reshape(-1, 1) for r in range(g.size)])
                check(got, expect, ("gather", root))
            else:
                assert got is None

            whole = value(dt, 100, g.size * n).reshape(g.size * n, 1)
            got = g.scatter(whole if g.rank == root else None, root,
                            out=None if g.rank == root else np.empty((n, 1), whole.dtype))
            check(got, whole[g.rank * n:(g.rank + 1) * n], ("scatter", root))
        for op in ops_for(dt):
            root = n % g.size
            got = g.reduce(value(dt, g.rank, n), op, root)
            if g.rank == root:
                expect = reference_op([value(dt, r, n) for r in range(g.size)], op)
                check(got, expect, ("reduce", np.dtype(dt).name, op))
            else:
                assert got is None
report("ok")
""",
    )


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_reduction_matches_numpy(run, size):
    results = run(
        size,
        COMMON
        + MORE
        + """
g = jaccl.init()
digests = []
for dt in DTYPES:
    for op in ops_for(dt):
        for n in (0, 1, 1000):
            make = factors if op == "prod" else value
            got = g.all_reduce(make(dt, g.rank, n), op)
            arrays = [make(dt, r, n) for r in range(g.size)]
            check(got, reference_op(arrays, op), ("all_reduce", np.dtype(dt).name, op, n))
            digests.append(digest(got))
# PyTorch's names of two of them.
assert (g.all_reduce(np.ones(3, np.int32), "product") == 1).all()
report(digests)
""",
    )
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_all_to_all_even_and_uneven(run, size):
    run(
        size,
        COMMON
        + """
g = jaccl.init()
n = g.size
for dt in (np.uint8, np.float32, np.complex64):
    # Equal blocks of 3 rows of 2.
    x = (np.arange(n * 3 * 2).reshape(n * 3, 2) + 1000 * g.rank).astype(dt)
    got = g.all_to_all(x)
    expect = np.concatenate([(np.arange(n * 3 * 2).reshape(n * 3, 2) + 1000 * s)
                             .astype(dt)[g.rank * 3:(g.rank + 1) * 3] for s in range(n)])
    check(got, expect, ("all_to_all", np.dtype(dt).name))
    # Uneven: rank s sends (s + d) % 3 rows to rank d (some zero), rank d's last gets
    # everything from rank 0 besides.
    def rows(s, d):
        return (s + d) % 3 + (5000 if s == 0 and d == n - 1 else 0)
    send = [rows(g.rank, d) for d in range(n)]
    recv = [rows(s, g.rank) for s in range(n)]
    x = (np.arange(sum(send) * 2).reshape(-1, 2) + 100_000 * g.rank).astype(dt)
    got = g.all_to_all_v(x, send, recv)
    parts = []
    for s in range(n):
        theirs = [rows(s, d) for d in range(n)]
        start = sum(theirs[:g.rank])
        full = (np.arange(sum(theirs) * 2).reshape(-1, 2) + 100_000 * s).astype(dt)
        parts.append(full[start:start + recv[s]])
    check(got, np.concatenate(parts), ("all_to_all_v", np.dtype(dt).name))
report("ok")
""",
    )


@pytest.mark.parametrize("size", [1, 3, 4])
def test_variable_size_gathers_and_reduce_scatters(run, size):
    run(
        size,
        COMMON
        + """
g = jaccl.init()
n = g.size
for counts in ([r % 2 * 7 for r in range(n)], [0] * (n - 1) + [20_000], [0] * n):
    x = np.full((counts[g.rank], 3), g.rank, np.int32)
    got = g.all_gather_v(x, counts)
    expect = np.concatenate([np.full((c, 3), r, np.int32) for r, c in enumerate(counts)])
    check(got, expect, ("all_gather_v", counts))
    whole = np.arange(sum(counts) * 3, dtype=np.float32).reshape(-1, 3) + g.rank
    got = g.reduce_scatter_v(whole, counts)
    total = sum(np.arange(sum(counts) * 3, dtype=np.float32).reshape(-1, 3) + r for r in range(n))
    start = sum(counts[:g.rank])
    check(got, total[start:start + counts[g.rank]].astype(np.float32), ("reduce_scatter_v", counts))
report("ok")
""",
    )


def test_mismatched_counts_raise_mismatch_on_every_rank(run):
    results = run(
        3,
        """
g = jaccl.init()
send = [1, 1, 1]
recv = [1, 1, 1]
if g.rank == 0:
    send[2] = 2
try:
    g.all_to_all_v(np.zeros(sum(send), np.int8), send, recv)
    report("no error")
except jaccl.Mismatch as e:
    report(str(e))
""",
    )
    for (message,) in results:
        assert "rank 0 sends 2 element(s) to rank 2, which expects 1" in message, message
