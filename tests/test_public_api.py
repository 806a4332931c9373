"""The public API is pinned: adding or removing a name is a decision."""

import inspect
import re

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
