"""The README's example: `jaccl launch -n 4 -- python examples/data_parallel.py`."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def jaccl_command():
    """The `jaccl` binary: $JACCL_BIN, else the workspace's build."""
    for candidate in (os.environ.get("JACCL_BIN"), ROOT / "target/release/jaccl", ROOT / "target/debug/jaccl"):
        if candidate and pathlib.Path(candidate).is_file():
            return str(candidate)
    if os.environ.get("JACCL_REQUIRE_ALL"):
        raise AssertionError("no jaccl binary (set JACCL_BIN or run cargo build)")
    pytest.skip("no jaccl binary: run cargo build first")


def test_data_parallel_example_matches_single_process_training():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "MLX_"))}
    example = str(ROOT / "examples/data_parallel.py")
    done = subprocess.run(
        [jaccl_command(), "launch", "-n", "4", "--", sys.executable, example],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "weights identical on every rank: True" in done.stdout
    assert "(ok)" in done.stdout
    assert "step    0  loss" in done.stdout


@pytest.mark.parametrize("victim, replace", [("0", False), ("3", False), ("0", True)])
def test_elastic_example_goes_on_without_a_killed_rank(victim, replace):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "MLX_"))}
    example = str(ROOT / "examples/elastic_training.py")
    command = [jaccl_command(), "launch", "--elastic", "-n", "4", "--", sys.executable, example]
    done = subprocess.run(
        command + ["--kill-rank", victim, "--kill-step", "20"] + (["--replace"] if replace else []),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shrank from 4 to 3 ranks" in done.stdout, done.stdout
    assert "weights identical on every surviving rank: True" in done.stdout, done.stdout
    assert f"rank {victim} (local) died: killed (SIGKILL); the others go on" in done.stderr, done.stderr
    if replace:
        # A new process took the lost one's place and trained on with the survivors.
        assert "a new process joined as rank 3" in done.stdout, done.stdout
        assert "4 rank(s) finished" in done.stdout, done.stdout

