"""Importing TensorFlow for the ``kerastower`` command, without its start-up log.

TensorFlow's start-up lines (oneDNN, CPU features, absl) are left out unless
``--verbose`` is given, so the first line the command prints is its own; an
import that fails shows them with its error.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def stderr_held_back() -> Iterator[None]:
    """Sends file descriptor 2 to a temporary file; shows it only on an error.

    TensorFlow's C++ libraries write their start-up lines to the process's
    standard error directly (absl logs everything that comes before its
    initialisation, whatever ``TF_CPP_MIN_LOG_LEVEL`` says), so
    redirecting ``sys.stderr`` would not catch them.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def import_tensorflow(verbose: bool) -> None:
    """Imports TensorFlow without its start-up log, unless `verbose`.

    Sets ``TF_CPP_MIN_LOG_LEVEL=3`` (where the environment does not set it)
    and imports TensorFlow with the process's standard error held back; if
    the import fails, what TensorFlow wrote is shown with the error. Does
    nothing once TensorFlow is imported.
    """
    if "tensorflow" in sys.modules or verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with stderr_held_back():
        import tensorflow  # noqa: F401
