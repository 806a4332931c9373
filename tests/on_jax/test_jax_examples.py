"""Every example of examples/on_jax runs on JAX and checks its own result."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "on_jax"

# Script -> text its output must contain.
RUNS = {
    "migrate_data_parallel.py": "same as one device",
}


def test_every_jax_example_is_run():
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(RUNS)


@pytest.mark.parametrize("script", sorted(RUNS))
def test_jax_example_runs(script):
    env = dict(os.environ, KERAS_BACKEND="jax")
    env.pop("XLA_FLAGS", None)  # the example sets its own devices
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert RUNS[script] in result.stdout
