"""`keras.applications` models train on towers as on one device (issue 13).

Deep convnets with `BatchNormalization` over a handful of examples amplify
float32 rounding, so the yardstick is one device fed the same batches with
the examples of each batch in another order: towers must be no further from
one device than that, with uneven splits (batches of 5 on 3 towers).

These take minutes to trace on CPUs and run with ``KERASTOWER_APPLICATIONS=1``.
Open question (issue 13): MobileNetV2 (48x48, alpha 0.35, SGD 1e-3, two
steps of 5 examples on 3 towers) ends 1.6e-2 from one device where one
reordering of the batches on one device is 7e-4 away; with batches of 6
(an even split) towers are 2.0e-2 away and the reordered run 2.0e-2. One
reordering is a noisy yardstick for so chaotic a model: the next step is
the spread over several reorderings.
"""

import os

import keras
import numpy as np
import pytest
from oracle import max_weight_diff, twin

HEAVY = pytest.mark.skipif(
    not os.environ.get("KERASTOWER_APPLICATIONS"),
    reason="minutes of tracing on CPUs: set KERASTOWER_APPLICATIONS=1",
)
APPLICATIONS = [
    pytest.param("MobileNetV2", {"alpha": 0.35}, id="MobileNetV2", marks=HEAVY),
    pytest.param("ResNet50", {}, id="ResNet50", marks=HEAVY),
    pytest.param("EfficientNetB0", {}, id="EfficientNetB0", marks=HEAVY),
    pytest.param("DenseNet121", {}, id="DenseNet121", marks=HEAVY),
]
BATCH = 5  # 10 examples on 3 towers: [2, 2, 1] twice
SIZE = 48


@pytest.mark.parametrize("name, kwargs", APPLICATIONS)
def test_application_trains_as_on_one_device(name, kwargs):
    def build():
        keras.utils.set_random_seed(0)
        return getattr(keras.applications, name)(
            input_shape=(SIZE, SIZE, 3), weights=None, classes=5, **kwargs
        )

    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, SIZE, SIZE, 3)).astype("float32")
    y = rng.integers(0, 5, size=(10,))
    # The same batches, each in another order.
    order = np.concatenate(
        [
            start + rng.permutation(min(BATCH, 10 - start))
            for start in range(0, 10, BATCH)
        ]
    )
    plain, towered = twin(build, 3)
    reordered = build()
    reordered.set_weights(plain.get_weights())
    losses = {}
    for label, model, (xs, ys) in (
        ("plain", plain, (x, y)),
        ("towers", towered, (x, y)),
        ("reordered", reordered, (x[order], y[order])),
    ):
        model.compile(
            optimizer=keras.optimizers.SGD(1e-3),
            loss="sparse_categorical_crossentropy",
        )
        history = model.fit(xs, ys, batch_size=BATCH, shuffle=False, verbose=0)
        losses[label] = history.history["loss"][0]
    towers_off = max_weight_diff(plain, towered)
    rounding = max_weight_diff(plain, reordered)
    print(f"\n{name}: towers {towers_off:.2e}, one device reordered {rounding:.2e}")
    assert towers_off <= max(rounding, 1e-5)
    assert abs(losses["towers"] - losses["plain"]) <= max(
        abs(losses["reordered"] - losses["plain"]), 1e-5 * abs(losses["plain"])
    )
