"""``kerastower --version``: the versions of kerastower, its backend and Keras."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kerastower import _installed_keras as installed_keras
from kerastower.cli import quiet_tensorflow

VERBOSE_FLAG = "--verbose"


class VersionAction(argparse.Action):
    """``--version``: the versions package metadata names, without importing
    TensorFlow (imported only where the metadata does not say)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs):
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if installed_keras.backend() == installed_keras.JAX_BACKEND:
            print(jax_version_line())
        else:
            print(version_line(installed_keras.installed_versions()))
        parser.exit()


def version_line(versions: tuple[str, str] | None = None) -> str:
    """``kerastower 0.1.0 (TensorFlow 2.21.0, Keras 3.15.1)``.

    Args:
        versions: TensorFlow's version and the Keras description, as
            `kerastower._installed_keras.installed_versions` reads them; or
            ``None`` for those of the TensorFlow and Keras imported.
    """
    from kerastower import __version__

    if versions is None:
        quiet_tensorflow.import_tensorflow(VERBOSE_FLAG in sys.argv[1:])
        import tensorflow as tf

        from kerastower._keras_compat import family

        versions = tf.__version__, family.describe()
    return f"kerastower {__version__} (TensorFlow {versions[0]}, {versions[1]})"


def jax_version_line() -> str:
    """``kerastower 0.1.0 (JAX 0.10.2, Keras 3.15.1)``, from package metadata."""
    from kerastower import __version__

    jax_version = installed_keras.installed_version("jax") or "not installed"
    keras_version = installed_keras.installed_version("keras")
    return f"kerastower {__version__} (JAX {jax_version}, Keras {keras_version})"
