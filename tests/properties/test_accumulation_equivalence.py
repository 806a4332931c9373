"""Property: accumulation over k micro-batches equals one device with batch k*b."""

import keras
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from oracle import assert_close, mlp, twin

from kerastower.callbacks import GradientAccumulation


@st.composite
def setups(draw):
    return (
        draw(st.integers(1, 4)),  # k
        draw(st.integers(1, 9)),  # micro-batch (global)
        draw(st.integers(1, 30)),  # samples
        draw(st.integers(1, 4)),  # towers
        draw(st.integers(0, 2**16)),  # seed
        draw(st.booleans()),  # replicate_variables
    )


@given(setups())
def test_accumulation_matches_one_device(setup):
    steps, micro, samples, towers, seed, replicas = setup
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 5)).astype("float32")
    y = rng.normal(size=(samples, 1)).astype("float32")
    plain, towered = twin(
        lambda: mlp(seed=seed % 5), towers, replicate_variables=replicas
    )
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    ha = plain.fit(
        x, y, batch_size=steps * micro, epochs=2, shuffle=False, verbose=0
    ).history
    hb = towered.fit(
        x,
        y,
        batch_size=micro,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[GradientAccumulation(steps)],
    ).history
    assert_close(ha["loss"], hb["loss"])
    for a, b in zip(plain.get_weights(), towered.get_weights(), strict=True):
        assert_close(a, b)
