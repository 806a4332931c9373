"""The private Keras hooks of kerastower on Keras 3's JAX backend, each checked.

The JAX counterpart of `kerastower._keras_compat` (TensorFlow's fence), which
it never imports: on JAX neither TensorFlow nor that fence is loaded.

`TowerModel` on JAX takes over where Keras's JAX trainer asks for its step
functions: ``make_train_function``, ``make_test_function`` and
``make_predict_function`` set ``train_function`` (and the others), which
``fit``, ``evaluate``, ``predict`` and the ``*_on_batch`` methods call as
``function(state, iterator)``, ``state`` being the tuple of variable values
that ``train_step(state, data)`` takes and returns. `check_trainer` checks
that contract against the installed Keras once, at import, so that a Keras
change gives a `KerasCompatibilityError`, never a silently different model.
"""

from __future__ import annotations

import inspect

try:
    import jax
except ImportError as error:
    raise ImportError(
        "Keras is set to its JAX backend (KERAS_BACKEND=jax, or keras.json), "
        "and jax is not installed: `pip install 'kerastower[jax]'` installs it "
        "with a Keras kerastower supports (see "
        "https://kerastower.github.io/kerastower/guides/jax/), or unset "
        "KERAS_BACKEND for TensorFlow."
    ) from error
import keras

from kerastower import _installed_keras as installed
from kerastower._errors import KerasCompatibilityError
from kerastower._keras_compat import keras3_functional

# Tested on Keras 3.15 with jax 0.10.2 (CPU) and 0.11.2 (CUDA).
SUPPORTED_KERAS = ">=3.15,<3.16"
SUPPORTED_JAX = ">=0.10,<0.12"
_KERAS_RANGE = ((3, 15), (3, 16))
_JAX_RANGE = ((0, 10), (0, 12))

# The step functions `TowerModel` makes, with the parameters Keras calls
# them with; the steps they run, with the parameters they take.
_HOOKS = {
    "make_train_function": ["self", "force"],
    "make_test_function": ["self", "force"],
    "make_predict_function": ["self", "force"],
    "train_step": ["self", "state", "data"],
    "test_step": ["self", "state", "data"],
    "predict_step": ["self", "state", "data"],
}


def _fail(hook: str, detail: str) -> KerasCompatibilityError:
    return KerasCompatibilityError(
        f"kerastower needs the Keras hook `{hook}`, which {detail} in the "
        f"installed Keras {keras.__version__} on JAX; kerastower supports Keras "
        f"{SUPPORTED_KERAS} there. Install a supported Keras, or report this."
    )


def check_installed(keras_version: str, jax_version: str) -> None:
    """Fails unless Keras and JAX are versions kerastower runs on.

    Raises:
        KerasCompatibilityError: Naming the command that installs a supported
            pair.
    """
    keras_release = installed.release(keras_version)
    jax_release = installed.release(jax_version)
    if _KERAS_RANGE[0] <= keras_release < _KERAS_RANGE[1] and (
        _JAX_RANGE[0] <= jax_release < _JAX_RANGE[1]
    ):
        return
    raise KerasCompatibilityError(
        f"kerastower on JAX supports Keras {SUPPORTED_KERAS} with jax "
        f"{SUPPORTED_JAX}. Received: keras=={keras_version}, "
        f"jax=={jax_version}. Install a supported pair with "
        f"`pip install 'keras{SUPPORTED_KERAS}' 'jax{SUPPORTED_JAX}'` (add "
        "`jax[cuda12]` or `jax[cuda13]` for GPUs)."
    )


def check_trainer() -> None:
    """Fails unless Keras's JAX trainer has the hooks `TowerModel` takes over.

    Raises:
        KerasCompatibilityError: Naming the first hook that is missing or
            takes other parameters.
    """
    for name, parameters in _HOOKS.items():
        method = getattr(keras.Model, name, None)
        if not callable(method) or list(inspect.signature(method).parameters) != (
            parameters
        ):
            raise _fail(f"keras.Model.{name}({', '.join(parameters[1:])})", "changed")


_FUNCTIONAL = keras3_functional.load(_fail)
Functional = _FUNCTIONAL.functional
functional_init_arguments = _FUNCTIONAL.functional_init_arguments
init_functional = _FUNCTIONAL.init_functional
register_alias = _FUNCTIONAL.register_alias


check_installed(keras.__version__, jax.__version__)
check_trainer()
