"""The environment of a Python process that a test starts."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout_env(**variables: str) -> dict[str, str]:
    """This process's environment with `variables`, for a child process.

    `TF_CONFIG` is left out (the child is no cluster worker unless the test
    says so), and this checkout comes first on ``PYTHONPATH``, so that the
    child imports the kerastower under test rather than an installed one.
    """
    env = dict(os.environ, **variables)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    return env
