"""Runs Python code on the ranks of a real jaccl job: one process per rank, on loopback, each
reading its rank, size, coordinator and token from the environment as under `jaccl launch`."""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

# Imported by every rank's code: numpy, jaccl, and `report(value)`, which prints one JSON line
# the test collects.
PRELUDE = """
import json, sys
import numpy as np
import jaccl
def report(value):
    print("RESULT " + json.dumps(value), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, size: int, port: int, token: str, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JACCL_", "MLX_"))}
    env.update(
        JACCL_RANK=str(rank),
        JACCL_SIZE=str(size),
        JACCL_COORDINATOR=f"127.0.0.1:{port}",
        JACCL_JOB_TOKEN=token,
        JACCL_LIVENESS="2",
    )
    env.update(extra)
    return env


def _default_sigint() -> None:
    # A shell starts background commands with SIGINT ignored, and Python then never installs
    # its KeyboardInterrupt handler: ranks started from such a test run must still get Ctrl-C
    # as a user's terminal gives it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Job:
    """The ranks of one job, started with `code` (after PRELUDE)."""

    def __init__(self, size: int, code: str, env: dict = None):
        port, token = free_port(), secrets.token_hex(16)
        source = PRELUDE + textwrap.dedent(code)
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", source],
                env=rank_env(r, size, port, token, env or {}),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_default_sigint,
            )
            for r in range(size)
        ]

    def wait_for_line(self, rank: int, text: str, timeout: float = 60) -> None:
        """Reads rank `rank`'s output until a line equal to `text`."""
        deadline = time.monotonic() + timeout
        for line in self.procs[rank].stdout:
            if line.strip() == text:
                return
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"rank {rank} never printed {text!r}")

    def kill(self, rank: int) -> None:
        self.procs[rank].send_signal(signal.SIGKILL)

    def results(self, timeout: float = 120) -> list:
        """Each rank's reported values (a list per rank); fails if a rank failed."""
        out, failures = [], []
        for r, p in enumerate(self.procs):
            try:
                stdout, stderr = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    q.kill()
                raise AssertionError(f"rank {r} did not finish within {timeout} s")
            if p.returncode != 0:
                failures.append(f"rank {r} exited with {p.returncode}:\n{stderr}")
            out.append(
                [json.loads(l[len("RESULT "):]) for l in stdout.splitlines() if l.startswith("RESULT ")]
            )
        # Every rank's failure: the first to fail is often not the first rank.
        assert not failures, "\n".join(failures)
        return out


@pytest.fixture
def job():
    """`job(size, code, env=None)` → a running Job (for tests that signal ranks); its
    processes are killed at the end of the test if still running."""
    jobs = []

    def start(size: int, code: str, env: dict = None) -> Job:
        j = Job(size, code, env)
        jobs.append(j)
        return j

    yield start
    for j in jobs:
        for p in j.procs:
            if p.poll() is None:
                p.kill()


@pytest.fixture
def run(job):
    """`run(size, code, env=None)` → each rank's reported values."""
    return lambda size, code, env=None: job(size, code, env).results()
