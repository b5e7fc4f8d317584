"""Failures surface as exceptions of jaccl.errors carrying rank, peer and op; nothing leaks."""

import time


def test_a_killed_rank_is_peer_lost_on_the_others(job):
    j = job(
        4,
        """
g = jaccl.init()
x = np.ones(1 << 16, np.float32)
g.all_sum(x)
print("READY", flush=True)
try:
    while True:
        g.all_sum(x)
        g.all_sum(x[:8])
except jaccl.Error as e:
    report([type(e).__name__, isinstance(e, jaccl.PeerLost), e.rank, e.peer, e.op, str(e)])
    # The group stays failed: the same error at once.
    try:
        g.barrier()
    except jaccl.PeerLost as again:
        report(str(again) == str(e))
""",
    )
    for r in range(4):
        j.wait_for_line(r, "READY")
    victim = 2
    killed = time.monotonic()
    j.kill(victim)
    for r in range(4):
        if r == victim:
            continue
        stdout, stderr = j.procs[r].communicate(timeout=60)
        after = time.monotonic() - killed
        assert j.procs[r].returncode == 0, stderr
        lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
        assert len(lines) == 2, stdout + stderr
        name, is_lost, rank, peer, op, msg = __import__("json").loads(lines[0][7:])
        assert (name, is_lost, rank, peer, op) == ("PeerLost", True, r, victim, "all_reduce"), msg
        assert lines[1] == "RESULT true"
        # Found by the connections or the liveness window (2 s here), far inside this bound.
        assert after < 30, after


def test_mismatched_calls_are_mismatch_with_the_peer(run):
    results = run(
        2,
        """
g = jaccl.init(timeout="20s")
try:
    g.all_sum(np.ones(10 if g.rank else 20, np.float32))
    report("no error")
except jaccl.Mismatch as e:
    report([e.rank, e.peer, e.op])
""",
    )
    assert results == [[[0, 1, "all_reduce"]], [[1, 0, "all_reduce"]]]


def test_a_receive_with_another_tag_is_a_mismatch(run):
    # Tags are checked, not matched: the message is not taken, the receiver learns why.
    results = run(
        2,
        """
g = jaccl.init(timeout="20s")
if g.rank == 0:
    g.send(np.ones(4, np.float32), 1, tag=7)
    report("sent")
else:
    try:
        g.recv(np.zeros(4, np.float32), 0, tag=8)
        report("received")
    except jaccl.Mismatch as e:
        report([e.rank, e.peer, e.op, "with tag 7" in str(e)])
""",
    )
    assert results == [["sent"], [[1, 0, "recv", True]]], results


def test_ranks_that_both_receive_first_are_a_deadlock(run):
    # The default liveness window (10 s, a beat a second); a timeout far beyond the test's.
    results = run(
        2,
        """
import time
g = jaccl.init(timeout="10m")
start = time.monotonic()
try:
    g.recv(np.zeros(4, np.float32), 1 - g.rank)
    report("received")
except jaccl.Deadlock as e:
    report([e.rank, e.op, "waits for data from rank" in str(e), time.monotonic() - start < 30])
""",
    )
    assert results == [[[0, "recv", True, True]], [[1, "recv", True, True]]]


def test_a_silent_peer_is_a_timeout(run):
    # The message has the words tools match on: "timed out", and " timeout " (PyTorch's tests).
    results = run(
        2,
        """
import time
g = jaccl.init(timeout="300ms", liveness="off")
if g.rank == 1:
    time.sleep(2)
    report("slept")
else:
    try:
        g.barrier()
    except jaccl.Timeout as e:
        said = "timed out" in str(e) and " timeout " in str(e) and "300ms" in str(e)
        report([e.rank, e.peer, e.op, isinstance(e, jaccl.Error), said])
""",
    )
    assert results[0] == [[0, None, "barrier", True, True]]


def test_bootstrap_and_config_errors():
    import jaccl

    try:
        jaccl.init(rank=0, size=2, coordinator="127.0.0.1:1", startup_timeout="300ms")
        raise AssertionError("no error")
    except jaccl.BootstrapError as e:
        assert e.op == "init" and "127.0.0.1:1" in str(e)
    try:
        jaccl.init(rank=3, size=2, coordinator="127.0.0.1:1")
        raise AssertionError("no error")
    except jaccl.ConfigError as e:
        assert "rank 3" in str(e)


def test_reference_counts_stay_stable_over_many_calls(run):
    results = run(
        2,
        """
import gc
g = jaccl.init()
x = np.ones(16, np.float32)
out = np.empty_like(x)
def counts():
    gc.collect()
    return [sys.getrefcount(x), sys.getrefcount(out), sys.getrefcount(g), len(gc.get_objects())]
before = counts()
for i in range(10_000):
    g.all_sum(x, out=out)
    g.all_gather(x)
    if i % 1000 == 0:
        try:
            g.all_sum(x, out=np.zeros(3, np.float32))
        except jaccl.InvalidArgument:
            pass
after = counts()
report([before, after])
""",
    )
    for [[before, after]] in results:
        assert before[:3] == after[:3], (before, after)
        # No objects pile up (a few may come and go with the interpreter's caches).
        assert after[3] - before[3] < 100, (before, after)


def test_ctrl_c_while_waiting_raises_keyboard_interrupt(job):
    j = job(
        2,
        """
import time
g = jaccl.init()
if g.rank == 1:
    time.sleep(4)
    sys.exit(0)
print("WAITING", flush=True)
start = time.monotonic()
try:
    g.barrier()
    report("no interrupt")
except KeyboardInterrupt:
    report(time.monotonic() - start)
try:
    g.all_sum(np.ones(2))
except jaccl.Interrupted as e:
    report([e.rank, e.op])
""",
    )
    j.wait_for_line(0, "WAITING")
    time.sleep(0.5)
    j.procs[0].send_signal(__import__("signal").SIGINT)
    stdout, stderr = j.procs[0].communicate(timeout=30)
    lines = [l[7:] for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert len(lines) == 2, stdout + stderr
    # Raised well before rank 1 (asleep for 4 s) could have arrived.
    assert float(lines[0]) < 3, lines
    assert lines[1] == '[0, "barrier"]'


def test_ctrl_c_during_start_up_raises_at_once(job):
    # A rank of a job whose other rank never comes: start-up would wait a minute.
    j = job(
        2,
        """
import time
print("STARTING", flush=True)
start = time.monotonic()
try:
    jaccl.init(rank=1, startup_timeout="60s")
except KeyboardInterrupt:
    report(time.monotonic() - start)
""",
    )
    j.kill(0)
    j.wait_for_line(1, "STARTING")
    time.sleep(0.5)
    j.procs[1].send_signal(__import__("signal").SIGINT)
    stdout, stderr = j.procs[1].communicate(timeout=30)
    lines = [l[7:] for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert len(lines) == 1 and float(lines[0]) < 5, stdout + stderr


def test_close_and_with(run):
    results = run(
        2,
        """
with jaccl.init() as g:
    total = g.all_sum(np.ones(3))
assert g.closed and g.topology is None and g.transport == [] and "closed" in repr(g)
try:
    g.barrier()
    report("no error")
except jaccl.Error as e:
    report(["closed" in str(e), e.rank == g.rank])
g.close()  # again: nothing happens
report(total.tolist())
""",
    )
    for r in results:
        assert r == [[True, True], [2.0, 2.0, 2.0]]


def test_getters_from_another_thread_during_calls_never_wait_for_them(run):
    # A thread reading the group's getters in a loop while the main thread all-reduces: the
    # getters must not take the lock a running call holds while they hold the GIL.
    results = run(
        2,
        """
import threading, datetime
g = jaccl.init(timeout=datetime.timedelta(seconds=30), liveness=datetime.timedelta(seconds=2))
stop, seen = threading.Event(), [0]
def poke():
    while not stop.is_set():
        repr(g); g.transport; g.closed; g.topology
        seen[0] += 1
t = threading.Thread(target=poke)
t.start()
x = np.ones(1 << 14, np.float32)
for _ in range(200):
    g.all_sum(x)
stop.set()
t.join(30)
report([not t.is_alive(), seen[0] > 0, float(g.all_sum(x)[0])])
""",
    )
    assert results == [[[True, True, 2.0]]] * 2


def test_exceptions_are_also_the_builtin_ones_they_are_like():
    import jaccl

    assert issubclass(jaccl.Timeout, TimeoutError)
    assert issubclass(jaccl.PeerLost, ConnectionError)
    assert issubclass(jaccl.IoError, OSError)
    assert issubclass(jaccl.InvalidArgument, ValueError)
    for cls in (jaccl.Timeout, jaccl.PeerLost, jaccl.IoError):
        assert issubclass(cls, jaccl.Error)


def test_durations_may_be_timedeltas():
    import datetime

    import jaccl

    with jaccl.init(timeout=datetime.timedelta(seconds=30)) as g:
        assert g.size == 1
    try:
        jaccl.init(timeout=datetime.timedelta(0))
        raise AssertionError("a zero timeout was accepted")
    except jaccl.ConfigError as e:
        assert "JACCL_TIMEOUT" in str(e), e


def test_close_or_abort_from_another_thread_stops_a_call_stuck_on_a_peer(run):
    # Rank 0 calls into groups `a` (blocking) and `b` (async_op) that rank 1 never enters (it
    # waits in a barrier of `g` meanwhile, alive): without the abort, each call would wait for
    # the whole 120 s timeout. A timer thread closes or aborts the group instead.
    code = """
import datetime, threading
g = jaccl.init(timeout=datetime.timedelta(seconds=120))
a, b = g.subgroup([0, 1]), g.subgroup([0, 1])
x = np.ones(1 << 10, np.float32)
stop = "{how}"
seen = []
if g.rank == 0:
    for group, asynchronous in ((a, False), (b, True)):
        threading.Timer(1.0, getattr(group, stop)).start()
        try:
            if asynchronous:
                group.all_sum(x, async_op=True).wait()
            else:
                group.all_sum(x)
            seen.append("no error")
        except jaccl.Error as e:
            seen.append([type(e).__name__, isinstance(e, jaccl.Timeout), e.rank, e.op, str(e)])
        try:
            group.barrier()
        except jaccl.Error as e:
            seen.append(["later", type(e).__name__, group.closed])
g.barrier()
report(seen)
"""
    for how in ("close", "abort"):
        stopped = run(2, code.replace("{how}", how))[0][0]
        blocking, later, asynchronous, later_async = stopped
        assert blocking[:4] == ["Aborted", False, 0, "all_reduce"], blocking
        assert "aborted" in blocking[4], blocking
        # close() ends an operation of the progress thread by dropping the group.
        expect = "Aborted" if how == "abort" else "Error"
        assert asynchronous[:4] == [expect, False, 0, "all_reduce"], asynchronous
        assert ("aborted" if how == "abort" else "closed") in asynchronous[4], asynchronous
        # Later calls raise at once: Aborted after abort() or a close() that aborted a call,
        # "closed" after a close() of an idle group.
        assert later[1:] == ["Aborted", True] and later_async[1:] == [expect, True], stopped
