"""Elastic groups from Python: a rank SIGKILLed mid-training (rank 0 included), the survivors
shrink and go on; revoke, agree, exclusions; on real jobs of processes."""

import json
import signal

import pytest


def survivors_results(job, victims, timeout=120):
    """Each survivor's reported values (the victims' are None); fails if a survivor failed."""
    out = []
    for r, p in enumerate(job.procs):
        stdout, stderr = p.communicate(timeout=timeout)
        if r in victims:
            assert p.returncode == -signal.SIGKILL, f"rank {r} was not killed: {stderr}"
            out.append(None)
            continue
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{stderr}"
        out.append([json.loads(l[len("RESULT "):]) for l in stdout.splitlines() if l.startswith("RESULT ")])
    return out


# A data-parallel loop: each step all-reduces the gradients (every rank's `rank + step`),
# and a lost rank makes the survivors shrink and redo the step; `VICTIM` kills itself in the
# middle of step 3. Every survivor ends with the same weights, which the test recomputes.
TRAINING = """
import os, signal
g = jaccl.init()
victim = int(os.environ["VICTIM"])
weights = np.zeros(1000, np.float64)
ranks = list(range(g.size))  # the original ranks of the current group's members
step = 0
while step < 8:
    if step == 3 and ranks[g.rank] == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    grads = np.full(1000, float(ranks[g.rank] + step))
    try:
        total = g.all_reduce(grads)
    except (jaccl.PeerLost, jaccl.Revoked) as e:
        agreed = g.agree(True)
        ranks = [ranks[r] for r in agreed.alive]
        g = g.shrink()
        continue  # redo the step
    weights -= 0.1 * total / g.size
    step += 1
report([g.rank, g.size, ranks, weights.tolist()[:3]])
"""


@pytest.mark.parametrize("victim", [0, 2])
def test_training_goes_on_after_a_rank_is_killed(job, victim):
    j = job(4, TRAINING, {"VICTIM": str(victim)})
    results = survivors_results(j, [victim])
    alive = [r for r in range(4) if r != victim]
    # The reference: steps 0-2 over 4 ranks, the rest over the survivors.
    w = 0.0
    for step in range(8):
        members = range(4) if step < 3 else alive
        w -= 0.1 * sum(r + step for r in members) / len(members)
    for r in alive:
        rank, size, ranks, weights = results[r][0]
        assert (rank, size, ranks) == (alive.index(r), 3, alive)
        assert weights == [w] * 3, f"rank {r}"


def test_revoke_stops_a_blocked_call_on_every_rank_and_shrink_renews_the_group(run):
    results = run(
        3,
        """
        import threading, time
        g = jaccl.init()
        if g.rank == 0:
            threading.Timer(0.2, g.revoke).start()
        try:
            if g.rank == 0:
                g.recv(np.zeros(4, np.int32), 1)  # rank 1 never sends
            else:
                g.barrier()  # rank 0 never comes
        except jaccl.Revoked as e:
            report(["Revoked", e.rank, e.peer])
        try:
            g.barrier()
        except jaccl.Revoked:
            report("still revoked")
        fresh = g.shrink()
        report([fresh.rank, fresh.size, int(fresh.all_sum(np.ones(1, np.int64))[0])])
        """,
    )
    for r, got in enumerate(results):
        assert got == [["Revoked", r, 0], "still revoked", [r, 3, 3]]


def test_agree_and_exclusions(run):
    results = run(
        4,
        """
        import time
        g = jaccl.init()
        if g.rank == 3:
            time.sleep(1)  # alive, left out, and not calling
            report("idle")
        else:
            fresh = g.shrink(exclude=[3])
            a = fresh.agree(fresh.rank != 1)
            report([fresh.rank, fresh.size, a.flag, a.alive, a.lost])
        """,
    )
    for r, got in enumerate(results[:3]):
        assert got == [[r, 3, False, [0, 1, 2], []]]
    assert results[3] == ["idle"]


def test_a_new_process_joins_with_the_invitation_and_gets_the_weights(run):
    results = run(
        3,
        """
        import os, subprocess
        g = jaccl.init()
        invitation = g.invitation()
        assert invitation == g.all_gather(np.frombuffer(invitation.encode(), np.uint8))[0].tobytes().decode()
        for bad in (0, -1):
            try:
                g.grow(bad)
                raise AssertionError(f"grow({bad}) did not raise")
            except ValueError:
                pass
        newcomer = None
        if g.rank == 0:
            code = (
                "import jaccl, numpy as np, json\\n"
                "g = jaccl.init(join=%r)\\n"
                "w = g.broadcast(np.zeros(4))\\n"
                "print('RESULT ' + json.dumps([g.rank, g.size, g.job_ranks, w.tolist()]), flush=True)\\n"
            ) % invitation
            newcomer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        g = g.grow(1)
        w = g.broadcast(np.arange(4.0) if g.rank == 0 else np.zeros(4))
        report([g.rank, g.size, g.job_ranks, w.tolist()])
        if newcomer is not None:
            out, _ = newcomer.communicate(timeout=60)
            assert newcomer.returncode == 0
            report(json.loads(out.split("RESULT ", 1)[1]))
        """,
    )
    newcomer = results[0][1][2][3]  # its job's rank: drawn from 2**20 .. 2**31
    assert 2**20 <= newcomer < 2**31
    expect = lambda r: [r, 4, [0, 1, 2, newcomer], [0.0, 1.0, 2.0, 3.0]]
    assert results[0] == [expect(0), expect(3)]
    assert results[1] == [expect(1)]
    assert results[2] == [expect(2)]
