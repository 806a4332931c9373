"""The public API is pinned: adding or removing a name is a decision."""

import importlib
import inspect
import re

import pytest

import kerastower
import kerastower.callbacks


def test_top_level_names():
    assert sorted(kerastower.__all__) == sorted(
        [
            "TowerModel",
            "TowerStrategy",
            "AllReduceOptions",
            "KerasCompatibilityError",
            "__version__",
            "available_devices",
            "batch_for_towers",
            "callbacks",
            "cluster",
            "configure_logical_devices",
            "evaluator",
            "global_batch_size",
            "is_chief",
            "is_multi_worker",
            "multi_worker",
            "num_workers",
            "split_sizes",
            "testing",
            "worker_index",
            "worker_strategy",
        ]
    )
    for name in kerastower.__all__:
        assert hasattr(kerastower, name), name


def test_callback_names():
    for name in kerastower.callbacks.__all__:
        assert hasattr(kerastower.callbacks, name), name
    for name in ("BatchScaling", "ChiefCheckpoint", "GradientAccumulation"):
        assert name in kerastower.callbacks.__all__


def test_version_is_a_version():
    assert re.match(r"^\d+\.\d+\.\d+", kerastower.__version__)


def test_tower_gradients_signature():
    parameters = inspect.signature(kerastower.TowerModel.tower_gradients).parameters
    assert list(parameters) == ["self", "loss_fn", "variables", "tensors", "has_aux"]
    assert parameters["tensors"].kind is inspect.Parameter.VAR_POSITIONAL
    assert parameters["has_aux"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["has_aux"].default is False


# The workers wing's public modules, at the paths they had before the code
# moved into `kerastower.workers`, and the names each hands on.
WORKER_MODULES = {
    "kerastower.cluster": [
        "TRAINING_TASK_TYPES",
        "EVALUATOR",
        "parse_tf_config",
        "tf_config",
        "num_workers_of",
        "worker_index_of",
        "is_chief_of",
        "num_workers",
        "worker_index",
        "is_multi_worker",
        "is_evaluator",
        "is_chief",
        "shard",
    ],
    "kerastower.multi_worker": [
        "DEFAULT_TIMEOUT_SECONDS",
        "prepare_workers",
        "worker_strategy",
        "timeout",
    ],
    "kerastower.evaluator": ["LOG_NAME", "SidecarEvaluator"],
    "kerastower.launch": [
        "LOOPBACK",
        "free_loopback_ports",
        "launch",
        "launch_slurm_task",
        "tf_config_for",
        "towers_per_worker",
    ],
}


@pytest.mark.parametrize("path", sorted(WORKER_MODULES))
def test_the_worker_modules_hand_on_the_objects_of_kerastower_workers(path):
    module = importlib.import_module(path)
    code = importlib.import_module(path.replace("kerastower.", "kerastower.workers."))
    assert module.__all__ == WORKER_MODULES[path]
    for name in module.__all__:
        assert getattr(module, name) is getattr(code, name), name
