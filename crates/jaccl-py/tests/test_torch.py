"""The torch.distributed backend, for real under torchrun: 2 and 4 ranks on one host, and 4
ranks on 2 pretend hosts (two torchrun "nodes" whose ranks have different `JACCL_HOST_ID`s,
so they talk TCP between the hosts and shared memory inside each). The ranks' code
(torch_ranks.py) uses torch's API only. Skipped without torch, unless JACCL_REQUIRE_TORCH=1
(CI), which makes a missing torch a failure."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
    if os.environ.get("JACCL_REQUIRE_TORCH"):
        raise

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script, args, nproc, nodes=1, env=None, timeout=300, expect_failure=False):
    """Runs `script args` under torchrun on `nodes` pretend hosts of `nproc` ranks each (each
    node its own torchrun with its own JACCL_HOST_ID); returns every rank's RESULT values.
    torchrun's scratch directories (torchelastic_*, which it leaves behind) go into a temporary
    directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="jaccl-torchrun-") as scratch:
        return _torchrun(script, args, nproc, nodes, dict(env or {}, TMPDIR=scratch), timeout, expect_failure)


def _torchrun(script, args, nproc, nodes, env, timeout, expect_failure):
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "MLX_"))}
    if os.environ.get("JACCL_TORCH_IMPORT"):
        base["JACCL_TORCH_IMPORT"] = "1"  # a torch without entry points (see torch_ranks.py)
    # A store a rank makes itself listens on TEST_SPARE_PORT: a port the kernel just handed out
    # and took back, not MASTER_PORT + k, which another test's connection may hold.
    base.update(OMP_NUM_THREADS="1", JACCL_LIVENESS="2", MASTER_PORT=str(port), TEST_SPARE_PORT=str(free_port()))
    base.update(env)
    procs = []
    for node in range(nodes):
        node_env = dict(base, JACCL_HOST_ID=f"pretend-host-{node}") if nodes > 1 else base
        command = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nodes}", f"--node-rank={node}", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={port}",
            str(script), *args,
        ]
        procs.append(
            subprocess.Popen(command, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results, failures = [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"torchrun did not finish within {timeout} s")
        if p.returncode != 0 and not expect_failure:
            failures.append(err[-6000:])
        results += parse_results(out)
    assert not failures, "\n".join(failures)
    return results


def parse_results(out: str) -> list:
    """The values after each `RESULT ` in `out` (the ranks' lines may run into each other)."""
    decoder, found = json.JSONDecoder(), []
    for piece in out.split("RESULT ")[1:]:
        value, _ = decoder.raw_decode(piece)
        found.append(value)
    return found


RANKS = HERE / "torch_ranks.py"


@pytest.mark.parametrize("nproc, nodes", [(2, 1), (4, 1), (2, 2)])
def test_every_collective_and_dtype_matches_its_reference(nproc, nodes):
    results = torchrun(RANKS, ["collectives"], nproc, nodes)
    assert len(results) == nproc * nodes
    for got in results:
        assert got["wrong"] == [] and got["backend"] == "jaccl", got


@pytest.mark.parametrize("nodes", [1, 2])
def test_new_group_and_a_2x2_device_mesh(nodes):
    results = torchrun(RANKS, ["groups"], 4 // nodes, nodes)
    assert [r["wrong"] for r in results] == [[]] * 4


@pytest.mark.parametrize("how", ["env", "tcp", "file", "store"])
def test_init_methods_and_stores(how, tmp_path):
    results = torchrun(RANKS, ["init_methods", how], 2, env={"TEST_FILE": str(tmp_path / "rendezvous")})
    assert [r["sum"] for r in results] == [[2.0, 2.0]] * 2
    # The job secret jaccl got is in no key or value of the store, nor in the environment.
    assert [r["secret_kept"] for r in results] == [True] * 2
    assert [r["monitored"] for r in results] == [[]] * 2


def test_a_user_token_is_used_as_it_is():
    results = torchrun(RANKS, ["user_token"], 2)
    for got in results:
        assert got["sum"] == [2.0, 2.0] and not got["passed_on"] and got["sealed"] == 0, got
    # With different tokens, rank 1 is refused by rank 0's coordinator, which waits for it.
    failed = {r["failed"][1].split(": ")[1]: r["failed"] for r in results}
    assert failed["rank 1"][0] == "BootstrapError" and "JACCL_JOB_TOKEN" in failed["rank 1"][1], failed
    assert failed["rank 0"][0] == "BootstrapError" and "waiting for rank(s) 1" in failed["rank 0"][1], failed
    for got in results:
        cause, text = got["one_sided"]
        assert cause == "BootstrapError" and "rank 1 was given a JACCL_JOB_TOKEN" in text, got
        assert "and rank 0 was not" in text, got


def test_two_jobs_with_one_identity_in_one_store_fail_instead_of_crossing(tmp_path):
    """Job "a" runs over a file store; job "b", the same program with the same identity (no
    launcher, same size), starts over the same file meanwhile: its ranks fail at once saying
    why, instead of joining "a"'s ranks; "a" goes on unharmed."""
    path, marker = str(tmp_path / "store"), str(tmp_path / "done")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "MLX_", "MASTER_", "TORCHELASTIC_"))}
    if os.environ.get("JACCL_TORCH_IMPORT"):
        base["JACCL_TORCH_IMPORT"] = "1"

    def start():
        return [
            subprocess.Popen(
                [sys.executable, str(RANKS), "shared_store", path, marker],
                env=dict(base, RANK=str(r), WORLD_SIZE="2", JACCL_LIVENESS="2"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]

    def outcome(procs):
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            results += parse_results(out)
        return results

    a = start()
    try:
        for p in a:  # both ranks of "a" have formed their job
            line = p.stdout.readline()
            assert line.startswith("RESULT "), line + p.stderr.read()[-3000:]
        b = outcome(start())
        assert len(b) == 2, b
        for got in b:
            cause, message = got["failed"]
            assert cause == "BootstrapError" and "another job" in message and "JACCL_JOB_ID" in message, got
    finally:
        open(marker, "w").close()
    outcome(a)


def test_groups_made_again_in_one_process():
    results = torchrun(RANKS, ["again"], 2)
    expect = [[2.0, 2.0]] * 2 + [[2.0, 2.0, "jaccl"]] + [[2.0, 2.0]] * 3
    assert [r["sums"] for r in results] == [expect] * 2


def test_an_exit_while_a_future_completes_does_not_abort():
    """A script that ends without destroy_process_group while a future's callback still runs
    on the thread that completes futures: the process exits cleanly (it aborted, SIGABRT, when
    the interpreter ended that thread inside torch's C++ callbacks; seen in CI in torch's DDP
    test)."""
    results = torchrun(RANKS, ["exit_while_completing"], 2)
    assert [r["sum"] for r in results] == [[2.0] * 4] * 2


def test_polls_p2p_rings_timeouts_aborts_and_tensors_changed_in_flight():
    """What a Work reports when polled, PREMUL_SUM's reduce, 80 MiB rings, messages differing
    by a whole piece, another thread's polls, Work.wait's timeout, new_group's timeout,
    abort()/shutdown() from a watchdog, set_() in flight."""
    results = torchrun(RANKS, ["hardening"], 3)
    assert [r["wrong"] for r in results] == [[]] * 3


def test_receives_from_any_source():
    results = torchrun(RANKS, ["any_source"], 3)
    assert [r["wrong"] for r in results] == [[]] * 3


def test_coalesced_all_gather_and_sparse_all_reduce():
    results = torchrun(RANKS, ["coalesced_and_sparse"], 3)
    assert [r["wrong"] for r in results] == [[]] * 3


@pytest.mark.parametrize("kind", ["hash", "file", "tcp", "prefix"])
def test_monitored_barrier_over_every_store(kind, tmp_path):
    """The monitored barrier's protocol over each store torch offers (a prefix store over a
    file store for "prefix"), its 3 ranks as threads of this process (a hash store lives in
    one): all come; rank 2 does not (rank 0 names it, rank 1 hears of it); ranks 1 and 2 do
    not (both named, wait_all_ranks); a zero timeout on rank 0 fails at once. The messages
    are Gloo's, which torch's tests match."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist
    from jaccl.torch import _monitored

    path, tcp = str(tmp_path / "store"), []

    def store(rank):
        if kind == "hash":
            return shared
        if kind == "tcp":
            made = dist.TCPStore("127.0.0.1", tcp[0].port if tcp else 0, 3, rank == 0, wait_for_workers=False)
            tcp.append(made)
            return made
        made = dist.FileStore(path, 3)
        return dist.PrefixStore("group/", made) if kind == "prefix" else made

    shared = dist.HashStore() if kind == "hash" else None
    stores = [store(r) for r in range(3)]
    outcomes = {}

    def rank(r, number, comes, timeout, wait_all):
        try:
            if comes:
                _monitored.monitored_barrier(stores[r], r, 3, number, timeout, timedelta(seconds=10), wait_all)
            outcomes[(number, r)] = "passed" if comes else "absent"
        except dist.DistBackendError as e:
            outcomes[(number, r)] = str(e)

    cases = [  # (who comes, rank 0's timeout, wait_all_ranks)
        ((0, 1, 2), timedelta(seconds=10), False),
        ((0, 1), timedelta(seconds=1), False),
        ((0,), timedelta(milliseconds=500), True),
        ((0,), timedelta(0), False),
    ]
    for number, (coming, timeout, wait_all) in enumerate(cases, 1):
        threads = [threading.Thread(target=rank, args=(r, number, r in coming, timeout, wait_all)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [outcomes[(1, r)] for r in range(3)] == ["passed"] * 3, outcomes
    assert "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms" in outcomes[(2, 0)], outcomes
    assert outcomes[(2, 1)].startswith("Rank 1 successfully reached monitoredBarrier, but received errors"), outcomes
    assert "rank 0 says: [Rank 0]: Rank 2 failed" in outcomes[(2, 1)], outcomes
    assert "[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 500 ms" in outcomes[(3, 0)], outcomes
    assert outcomes[(4, 0)].startswith("Rank 0 timed out in monitoredBarrier after 0 ms"), outcomes


def test_groups_made_and_destroyed_leave_nothing_behind():
    results = torchrun(RANKS, ["cycles"], 2)
    for got in results:
        assert got["after"][0] == [] and got["after"] == got["before"], got
        assert got["sum"] == [4.0, 4.0], got


def test_a_lost_rank_is_a_dist_backend_error_naming_it():
    # torchrun stops every rank once it sees one fail, every 0.1 s by default: sooner than a
    # loaded machine lets the survivors report (1 run in 6 here lost one). Every 5 s instead.
    results = torchrun(RANKS, ["lose_a_rank"], 3, env={"PET_MONITOR_INTERVAL": "5"}, expect_failure=True)
    assert len(results) == 2, results
    for got in results:
        assert got["error"] == "DistBackendError", got
        assert got["cause"] == "PeerLost", got
        assert got["peer"] in (1, 0, 2), got
        assert "rank 1" in got["message"], got


def test_shrink_group_goes_on_without_a_killed_rank_0():
    # torchrun would stop the survivors once it saw rank 0 die: it looks every 5 s here.
    results = torchrun(RANKS, ["shrink_after_a_kill"], 4, env={"PET_MONITOR_INTERVAL": "5"}, expect_failure=True)
    assert len(results) == 3, results
    for got in sorted(results, key=lambda g: g["rank"]):
        assert got["caught"] == "PeerLost", got
        assert got["torch_says"] is True, got
        assert (got["size"], got["ranks"], got["default"]) == (3, [1, 2, 3], True), got
        assert got["sum"] == [6.0] * 4, got  # old ranks 1 + 2 + 3
    assert sorted(g["rank"] for g in results) == [0, 1, 2]
    assert [g["sub"] for g in sorted(results, key=lambda g: g["rank"])] == [[2.0], [2.0], [1.0]]


def test_pytorch_suite_part():
    """The part of PyTorch's own distributed suite that CI runs, every group made by jaccl
    (torch_suite.py's CI_TESTS, at 2 ranks): each passes. Its whole: torch_suite.py."""
    import importlib.util

    if importlib.util.find_spec("expecttest") is None and not os.environ.get("JACCL_REQUIRE_TORCH"):
        pytest.skip("torch's test suite needs expecttest (pip install expecttest)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "MLX_"))}
    run = subprocess.run(
        [sys.executable, str(HERE / "torch_suite.py"), "--ci"], env=env, capture_output=True, text=True, timeout=1200
    )
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]


def example(name, nproc, *args, nodes=1, expect_failure=False):
    return torchrun(
        ROOT / "examples" / name, list(args), nproc, nodes, timeout=600, expect_failure=expect_failure
    )


def test_ddp_example_matches_gloo_and_keeps_ranks_identical():
    jaccl = example("torch_ddp.py", 4, "--backend", "jaccl", "--steps", "30")
    # The reference run only needs its results: torch 2.10's gloo sometimes aborts in its
    # teardown after every rank reported ("terminate called without an active exception").
    gloo = example("torch_ddp.py", 4, "--backend", "gloo", "--steps", "30", expect_failure=True)
    assert len(gloo) == 4, gloo
    assert len({r["weights"] for r in jaccl}) == 1, "weights differ between ranks"
    ours, theirs = jaccl[0]["losses"], gloo[0]["losses"]
    assert len(ours) == len(theirs) == 30
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (ours, theirs)


def test_fsdp_example():
    results = example("torch_fsdp.py", 2)
    assert all(r["ok"] for r in results), results


def test_tensor_parallel_example_on_a_2x2_mesh():
    results = example("torch_tp.py", 4)
    assert all(r["ok"] for r in results), results


def test_the_benchmark_against_gloo_runs_every_part(tmp_path):
    """`python -m jaccl.torch.bench` (kept working, not timed here): a row per collective and
    size with both backends' times, and the DDP step over each."""
    from jaccl.torch import bench

    rows_file = tmp_path / "rows.json"
    args = ["--sizes", "8,64K", "--reps", "1", "--seconds", "0.01", "--ddp-steps", "2", "--json", str(rows_file)]
    torchrun(bench.__file__, args, 2)
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    collectives = [r for r in rows if r["op"] != "ddp_step"]
    assert {(r["op"], r["bytes"]) for r in collectives} == {
        (op, size) for op in bench.OPS.split(",") for size in (8, 64 * 1024)
    }
    assert all(r["jaccl_us"] > 0 and r["gloo_us"] > 0 for r in collectives), collectives
    (ddp,) = [r for r in rows if r["op"] == "ddp_step"]
    assert all(ddp[f"{name}{mode}_ms"] > 0 for name in ("jaccl", "gloo") for mode in ("", "_no_sync")), ddp
