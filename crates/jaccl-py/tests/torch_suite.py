"""PyTorch's own distributed suite with every process group made by jaccl.

The suite is ``DistributedTest._DistTestBase`` with ``TestDistBackend``, from
``torch/testing/_internal/distributed/distributed_test.py`` (shipped in torch's wheel), which
upstream runs through ``test/distributed/test_distributed_spawn.py`` with ``BACKEND`` and
``WORLD_SIZE`` set: each test spawns ``WORLD_SIZE`` processes that make their groups with
``init_process_group(BACKEND)`` and ``new_group`` over a file store. This module is that
driver. The suite branches on ``BACKEND`` to choose what a backend is expected to do, so it
runs with ``BACKEND=gloo`` (Gloo's code paths: CPU tensors, what Gloo supports), and every
group torch is asked to make with the "gloo" backend is made with "jaccl" instead: the one
function through which ``init_process_group``, ``new_group`` and their kin make a group
(``distributed_c10d._new_process_group_helper``) is wrapped, in every process (spawned ones
import this module again), to pass "jaccl" for "gloo". The groups are then exactly those a
user's ``init_process_group("jaccl")`` makes, and ``dist.get_backend()`` says "jaccl" (so the
suite does not look for Gloo's profiler events). ``JACCL_SUITE_BACKEND=gloo`` leaves Gloo in
place, to compare.

Run it from the repository (``--ranks 3``: 3 ranks; ``--backend gloo``: Gloo itself;
``--ci``: the part CI runs; ``-k EXPR``: pytest's selection)::

    target/py-venv/bin/python crates/jaccl-py/tests/torch_suite.py --ranks 2

which runs the suite under pytest (``WORLD_SIZE=2 python -m pytest torch_suite.py`` does too),
then prints how many tests passed, failed and were skipped, the time, and each failure with its
first lines; it exits non-zero if a test failed that ``DIFFERS`` does not list (or, with
``--ci``, if a test of ``CI_TESTS`` did not pass).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
# As upstream's CI runs the suite with a file:// init method (each test's setUp then gives its
# processes a file of their own): test_barrier_timeout_global runs only so.
os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(tempfile.gettempdir(), "jaccl-suite-init"))

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if os.environ.get("JACCL_SUITE_BACKEND", "jaccl") == "jaccl":
    import torch.distributed.distributed_c10d as c10d

    import jaccl.torch  # noqa: F401 (registers "jaccl" on torch versions without entry points)

    _make_group = c10d._new_process_group_helper

    def _jaccl_for_gloo(size, rank, ranks, backend, *args, **kwargs):
        return _make_group(size, rank, ranks, "jaccl" if backend == "gloo" else backend, *args, **kwargs)

    c10d._new_process_group_helper = _jaccl_for_gloo

# The tests expected to fail on jaccl, and why (only tests that assert Gloo by name).
DIFFERS = {
    "test_get_backend": "asserts that dist.get_backend() is BACKEND, 'gloo'; jaccl's groups say 'jaccl'",
}

# The part of the suite that CI runs (test_torch.py), at 2 ranks, each of which must pass: a
# test of each collective and of its form on a sub-group, point to point with tags, in
# batches and from any source, the coalesced forms, sparse all-reduce, the object
# collectives, barriers and their timeouts, monitored_barrier, and DDP on the CPU. Each test
# costs 3-4 s here (mostly starting its processes), those skipped too: the whole suite,
# 13-14 minutes at 2 ranks, is for `torch_suite.py` by hand.
CI_TESTS = [
    "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_all_gather",
    "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_with_empty",
    "test_all_gather_full_group",
    "test_all_gather_object_subgroup",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_barrier",
    "test_barrier_timeout_full_group",
    "test_barrier_timeout_global",
    "test_batch_isend_irecv_gloo_tags",
    "test_broadcast_full_group",
    "test_ddp_logging_data_cpu",
    "test_destroy_group",
    "test_gather_checks",
    "test_get_future",
    "test_irecv",
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_monitored_barrier_gloo_subgroup",
    "test_reduce_full_group_product",
    "test_reduce_sum_twice",
    "test_scatter_checks",
    "test_scatter_object_list",
    "test_send_recv_any_source",
    "test_send_recv_any_source_torch_profiler",
    "test_send_recv_with_tag",
    "test_sparse_all_reduce_sum",
    "test_static_graph_api_cpu",
]


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description="PyTorch's distributed suite over jaccl")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", choices=["jaccl", "gloo"], default="jaccl")
    parser.add_argument("--ci", action="store_true", help="only CI_TESTS, each of which must pass")
    parser.add_argument("-k", dest="select", help="pytest's -k expression")
    args = parser.parse_args(argv)
    env = dict(os.environ, WORLD_SIZE=str(args.ranks), JACCL_SUITE_BACKEND=args.backend)
    tests = [f"{__file__}::TestDistBackendWithSpawn::{name}" for name in CI_TESTS] if args.ci else [__file__]
    with tempfile.TemporaryDirectory(prefix="jaccl-suite-") as scratch:
        report = os.path.join(scratch, "report.xml")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests]
        if args.select:
            command += ["-k", args.select]
        started = time.monotonic()
        subprocess.run(command, env=dict(env, TMPDIR=scratch), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.monotonic() - started
        outcomes = _outcomes(report)
    failed = {name: why for name, (outcome, why) in outcomes.items() if outcome == "failed"}
    count = {o: sum(1 for outcome, _ in outcomes.values() if outcome == o) for o in ("passed", "failed", "skipped")}
    print(f"{args.backend}, {args.ranks} ranks: {count['passed']} passed, {count['failed']} failed, "
          f"{count['skipped']} skipped in {seconds:.0f} s")
    for name, why in sorted(failed.items()):
        expected = f" (expected: {DIFFERS[name]})" if name in DIFFERS and args.backend == "jaccl" else ""
        print(f"FAILED {name}{expected}: {why}")
    unexpected = [n for n in failed if args.backend != "jaccl" or n not in DIFFERS]
    missing = [n for n in CI_TESTS if outcomes.get(n, ("absent",))[0] != "passed"] if args.ci else []
    for name in missing:
        print(f"NOT PASSED {name}: {outcomes.get(name, ('absent', ''))[0]}")
    return 1 if unexpected or missing or not outcomes else 0


def _outcomes(report: str) -> dict:
    """Each test's outcome (passed, failed, skipped) and, if not passed, why (first lines),
    from pytest's JUnit XML report."""
    outcomes = {}
    try:
        cases = ET.parse(report).iter("testcase")
    except (OSError, ET.ParseError):
        return outcomes
    for case in cases:
        outcome, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, why = "failed", " | ".join((child.get("message") or "").splitlines()[:4])
            elif child.tag == "skipped":
                outcome, why = "skipped", child.get("message") or ""
        outcomes[case.get("name")] = (outcome, why)
    return outcomes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
