"""Runs a `bench` module in a subprocess, as a user runs it, for the smoke tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(
    module: str, *args: str, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Runs ``python -m MODULE ARGS...`` from the repository root."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
