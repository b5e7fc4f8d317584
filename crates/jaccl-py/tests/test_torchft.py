"""jaccl as a torchft process group (``jaccl.torch.torchft.ProcessGroupJaccl``): torchft's own
process group tests (its ``MultiPgBaseTest``: every collective, then the resiliency test, in
which each rank reconfigures, the last one shuts down and the others' next call fails), and
torchft's ``Manager`` with DDP over replica groups, one killed and replaced mid-training."""

import importlib.util
import os

import pytest

# Skipped without torchft (and parameterized, which its tests import), unless
# JACCL_REQUIRE_TORCH=1 (CI), where a missing one fails at the import below.
if not os.environ.get("JACCL_REQUIRE_TORCH"):
    for needed in ("torch", "torchft", "parameterized"):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"{needed} is not installed", allow_module_level=True)

from datetime import timedelta  # noqa: E402

from parameterized import parameterized  # noqa: E402
from torchft.process_group_test import MultiPgBaseTest, _ALL_COLLECTIVES  # noqa: E402

from jaccl.torch.torchft import ProcessGroupJaccl  # noqa: E402


class JacclMultiPgTest(MultiPgBaseTest):
    """torchft's tests of a process group, over jaccl, with 3 ranks (threads) and every
    collective torchft has (Gloo skips all-to-all and the reduce-scatters)."""

    BACKEND = "jaccl"
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend: str) -> ProcessGroupJaccl:
        return ProcessGroupJaccl(timeout=timedelta(seconds=10))

    def assertRaisesRegex(self, expected, regex, *args, **kwargs):
        # The resiliency test lists each backend's error for a peer that shut down (Gloo's
        # "Connection closed by peer", NCCL's "aborted"); jaccl's names the rank that left.
        if "Connection closed by peer" in regex or regex == "aborted":
            regex = f"({regex}|lost rank 2: rank 2 left the group)"
        return super().assertRaisesRegex(expected, regex, *args, **kwargs)

    @parameterized.expand(_ALL_COLLECTIVES)
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")

    @parameterized.expand(_ALL_COLLECTIVES)
    def test_collective_with_resiliency(self, collective: str) -> None:
        self._run_with_resiliency(collective, device="cpu")

    @parameterized.expand(["allreduce", "allgather", "alltoall_base", "barrier"])
    def test_survivors_fail_naming_the_rank_that_shut_down(self, collective: str) -> None:
        """torchft's resiliency check also passes a call that does not fail ("no error"):
        here the survivors of a collective that needs the last rank must fail, with jaccl's
        PeerLost naming it, and `errored()` must say so."""
        import jaccl
        from torchft.process_group_test import _COLLECTIVE_TO_FUNC
        import torch

        def worker(pg: ProcessGroupJaccl, rank: int) -> None:
            pg.configure(f"localhost:{self.store.port}/survivors_{collective}", "0", rank, self.WORLD_SIZE)
            _COLLECTIVE_TO_FUNC[collective](pg, rank, torch.tensor([rank + 1]))
            if rank == self.WORLD_SIZE - 1:
                pg.shutdown()
                return
            with self.assertRaises(Exception) as raised:
                _COLLECTIVE_TO_FUNC[collective](pg, rank, torch.tensor([rank + 1]))
            self.assertIsInstance(raised.exception.__cause__, jaccl.PeerLost)
            self.assertIn("lost rank 2", str(raised.exception))
            self.assertIn("lost rank 2", str(pg.errored()))

        futures = [self.executor.submit(worker, self.pg_pool[r], r) for r in range(self.WORLD_SIZE)]
        self._collect(futures)


def test_abort_from_another_thread_stops_a_blocked_call():
    import threading

    import torch
    from torch.distributed import TCPStore

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pgs = [ProcessGroupJaccl(timeout=timedelta(seconds=60)) for _ in range(2)]
    threads = [
        threading.Thread(target=pg.configure, args=(f"localhost:{store.port}/abort", "0", r, 2))
        for r, pg in enumerate(pgs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Rank 1 never sends: only the abort ends rank 0's wait.
    threading.Timer(0.2, pgs[0].abort).start()
    with pytest.raises(Exception, match="abort"):
        pgs[0].recv([torch.zeros(4)], 1, 0).wait()
    assert "aborted" in str(pgs[0].errored())
    pgs[1].shutdown()


def test_manager_with_ddp_goes_on_after_a_replica_dies_and_takes_its_replacement_back(tmp_path):
    """examples/torchft_ddp.py under torchft's Manager, 2 replica groups over jaccl: one is
    SIGKILLed, the survivor commits steps without it, a replacement heals from the survivor and
    both commit together, their weights equal (benches/torchft_recovery.py, one trial)."""
    import json
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "trial.json"
    # A session of its own: should the trial not end, killing it takes its lighthouse and
    # replica groups too.
    bench = subprocess.Popen(
        [sys.executable, str(root / "benches/torchft_recovery.py"), "--trials", "1", "--pgs", "jaccl",
         "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    assert bench.returncode == 0, output
    (trial,) = json.loads(out.read_text())
    assert trial["healed"] and trial["weights_agree"], trial


def test_replica_groups_of_different_launcher_jobs_form_one_group():
    """Under torchrun every replica group is a launcher job of its own (its run id, restart
    count and master port): their ranks must still meet in the store torchft gives them."""
    import subprocess
    import sys

    from torch.distributed import TCPStore

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    code = (
        "import sys, torch\n"
        "from torch.distributed import ReduceOp\n"
        "from jaccl.torch.torchft import ProcessGroupJaccl\n"
        "pg = ProcessGroupJaccl()\n"
        "rank = int(sys.argv[1])\n"
        f"pg.configure('localhost:{store.port}/torchft/1/0', str(rank), rank, 2)\n"
        "t = torch.tensor([rank + 1.0])\n"
        "pg.allreduce([t], ReduceOp.SUM).wait()\n"
        "print('SUM', t.item(), pg.rank(), flush=True)\n"
        "pg.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "TORCHELASTIC_", "MASTER_"))}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r)],
            env=dict(env, TORCHELASTIC_RUN_ID=f"replica{r}", TORCHELASTIC_RESTART_COUNT=str(r),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + r)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(2)
    ]
    for r, p in enumerate(ranks):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert f"SUM 3.0 {r}" in out, out + err
