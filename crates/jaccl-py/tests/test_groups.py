"""Sub-groups (split, subgroup) and nonblocking calls (async_op=True, jaccl.Work), on real
jobs of processes."""

import pytest


@pytest.mark.parametrize("size", [1, 3, 4])
def test_split_by_parity_with_keys_none_and_nested(run, size):
    results = run(
        size,
        """
        g = jaccl.init()
        r, n = g.rank, g.size
        # Parity groups, each in reverse rank order (the key reorders).
        sub = g.split(r % 2, key=n - r)
        members = sub.all_gather(np.array([r], np.int64))[:, 0].tolist()
        report(["parity", sub.rank, sub.size, members])
        # Every third rank joins no group.
        none = g.split(None if r % 3 == 0 else 1)
        report(["some", None if none is None else none.all_sum(np.array([r], np.int64)).tolist()])
        # A sub-group of the sub-group, by list: its last rank alone... and then all of it.
        nested = sub.subgroup([sub.size - 1])
        report(["nested", None if nested is None else nested.size])
        # The parent is still usable.
        report(["parent", int(g.all_sum(np.ones(1, np.int32))[0])])
        """,
    )
    for r, got in enumerate(results):
        same = [q for q in range(size) if q % 2 == r % 2]
        expect = sorted(same, key=lambda q: size - q)
        assert got[0] == ["parity", expect.index(r), len(expect), expect]
        some = [q for q in range(size) if q % 3 != 0]
        assert got[1] == ["some", None if r % 3 == 0 else [sum(some)]]
        assert got[2] == ["nested", 1 if expect.index(r) == len(expect) - 1 else None]
        assert got[3] == ["parent", size]


def test_split_mismatch_raises_on_every_rank(run):
    results = run(
        3,
        """
        g = jaccl.init()
        try:
            if g.rank == 0:
                g.subgroup([0, 1])
            else:
                g.subgroup([1, 2])
            report("formed")
        except jaccl.Mismatch as e:
            report(["Mismatch", e.rank, e.peer])
        """,
    )
    for r, got in enumerate(results):
        kind, rank, peer = got[0]
        assert (kind, rank) == ("Mismatch", r)
        assert peer != r and (r == 0 or peer == 0)


def test_tensor_and_data_parallel_groups_from_two_threads(run):
    results = run(
        4,
        """
        import threading
        g = jaccl.init()
        r = g.rank
        tp, dp = g.split(r // 2), g.split(r % 2)
        sums = {}
        def work(name, group):
            total = 0
            for i in range(200):
                total += int(group.all_sum(np.array([r + i], np.int64))[0])
            sums[name] = total
        threads = [threading.Thread(target=work, args=a) for a in (("tp", tp), ("dp", dp))]
        [t.start() for t in threads]
        [t.join() for t in threads]
        report(sums)
        """,
    )
    for r, got in enumerate(results):
        tp = [q for q in range(4) if q // 2 == r // 2]
        dp = [q for q in range(4) if q % 2 == r % 2]
        expect = lambda members: sum(sum(q + i for q in members) for i in range(200))
        assert got[0] == {"tp": expect(tp), "dp": expect(dp)}


@pytest.mark.parametrize("size", [1, 2, 4])
def test_sixteen_async_all_reduces_waited_in_reverse(run, size):
    results = run(
        size,
        """
        g = jaccl.init()
        works = [g.all_sum(np.full(1000 * (k + 1), g.rank + k, np.float32), async_op=True)
                 for k in range(16)]
        # Blocking calls after them run after them.
        total = g.all_sum(np.ones(3, np.int64))
        out = []
        for k, w in reversed(list(enumerate(works))):
            assert w.wait() is True and w.is_completed()
            x = w.result()
            out.append([k, float(x[0]), float(x[-1]), len(x)])
        report([out, total.tolist()])
        """,
    )
    for got in results:
        out, total = got[0]
        assert total == [size] * 3
        for k, first, last, length in out:
            s = sum(r + k for r in range(size))
            assert (first, last, length) == (s, s, 1000 * (k + 1))


def test_every_call_can_be_async_and_keeps_its_arrays(run):
    results = run(
        3,
        """
        import gc
        g = jaccl.init()
        r, n = g.rank, g.size
        works = [
            g.all_gather(np.full(4, r, np.int32), async_op=True),
            g.reduce_scatter(np.ones((n * 2, 2), np.float64), op="max", async_op=True),
            g.broadcast(np.full(5, r, np.int16), root=1, async_op=True),
            g.reduce(np.full(2, r, np.int64), root=2, async_op=True),
            g.gather(np.full(2, r, np.uint8), root=0, async_op=True),
            g.scatter(np.arange(n * 2, dtype=np.float32) if r == 0 else None, root=0,
                      out=np.empty(2, np.float32), async_op=True),
            g.all_to_all(np.arange(n, dtype=np.int64) + 10 * r, async_op=True),
            g.all_to_all_v(np.arange(n), [1] * n, [1] * n, async_op=True),
            g.all_gather_v(np.full(r + 1, r), [q + 1 for q in range(n)], async_op=True),
            g.reduce_scatter_v(np.ones(6), [1, 2, 3], async_op=True),
            g.send(np.full(3, r, np.int8), (r + 1) % n, async_op=True),
            g.recv(np.empty(3, np.int8), (r - 1) % n, async_op=True),
            g.barrier(async_op=True),
        ]
        gc.collect()  # the inputs above have no other reference: the Works keep them
        out = []
        for w in works:
            x = w.result()
            out.append(None if x is None else np.asarray(x).ravel().tolist())
        report(out)
        """,
    )
    n = 3
    for r, (out,) in enumerate(results):
        assert out[0] == sum(([q] * 4 for q in range(n)), [])
        assert out[1] == [1.0] * 4
        assert out[2] == [1] * 5
        assert out[3] == ([0 + 1 + 2] * 2 if r == 2 else None)
        assert out[4] == ([0, 0, 1, 1, 2, 2] if r == 0 else None)
        assert out[5] == [2 * r, 2 * r + 1]
        assert out[6] == [r + 10 * q for q in range(n)]
        assert out[7] == [r] * n
        assert out[8] == sum(([q] * (q + 1) for q in range(n)), [])
        assert out[9] == [3.0] * (r + 1)
        assert out[10] is None
        assert out[11] == [(r - 1) % n] * 3
        assert out[12] is None


def test_async_errors_raise_on_wait_and_timeouts_return_false(run):
    results = run(
        2,
        """
        import time
        from datetime import timedelta
        g = jaccl.init()
        if g.rank == 1:
            time.sleep(0.5)
        w = g.barrier(async_op=True)
        report(["early", w.wait(timeout=timedelta(milliseconds=20))])
        report(["done", w.wait(timeout=30)])
        # Lengths that disagree: the error comes out of wait, and poisons the group.
        w = g.all_sum(np.ones(4 + g.rank, np.float32), async_op=True)
        try:
            w.wait()
            report("no error")
        except jaccl.Error as e:
            report([type(e).__name__ in ("Mismatch", "PeerLost"), e.rank])
        try:
            g.barrier()
        except jaccl.Error as e:
            report("poisoned")
        """,
    )
    assert results[0][0] == ["early", False]
    for r, got in enumerate(results):
        assert got[1] == ["done", True]
        assert got[2] == [True, r]
        assert got[3] == "poisoned"


def test_closing_with_operations_in_flight_fails_them(run):
    results = run(
        2,
        """
        g = jaccl.init()
        works = []
        if g.rank == 0:
            # Operations rank 1 never calls.
            works = [g.all_sum(np.ones(1 << 16, np.float32), async_op=True) for _ in range(4)]
        g.close()
        errors = []
        for w in works:
            try:
                w.wait(timeout=30)
                errors.append("none")
            except jaccl.Error as e:
                errors.append(type(e).__name__)
        report(errors)
        """,
    )
    assert len(results[0][0]) == 4
    assert all(e in ("Error", "PeerLost") for e in results[0][0]), results[0]
