"""Property: on JAX, N towers train, evaluate and predict as one device, for
any batch size, optimizer and step option.

The space of tests/properties/test_tower_equivalence.py (`spaces.fits`:
towers, batch size, samples, optimizer, sample weights, seed), plus how
Keras runs the step: ``jit_compile``, ``run_eagerly`` and
``steps_per_execution``. In float64, so
the tolerance can be tight (jax_oracle).
"""

import keras
import numpy as np
import spaces
from hypothesis import given
from hypothesis import strategies as st
from jax_oracle import TOLERANCE, assert_same, float64, mlp, twin

OPTIMIZERS = spaces.optimizers(keras)


@st.composite
def setups(draw):
    return {
        **draw(spaces.fits()),
        "run": draw(st.sampled_from(["jit", "no_jit", "eager"])),
        "steps_per_execution": draw(st.sampled_from([1, 3])),
    }


@given(setups())
def test_towers_match_one_device(setup):
    rng = np.random.default_rng(setup["seed"])
    samples = setup["samples"]
    x, y = rng.normal(size=(samples, 5)), rng.normal(size=(samples, 1))
    weights = rng.uniform(0.0, 2.0, (samples,)) if setup["weighted"] else None
    run = {
        "jit": {},
        "no_jit": {"jit_compile": False},
        "eager": {"run_eagerly": True},
    }[setup["run"]]

    def build(cls, **kwargs):
        model = mlp(cls, OPTIMIZERS[setup["optimizer"]](), **kwargs)
        model.compile(
            optimizer=model.optimizer,
            loss="mse",
            metrics=["mae"],
            steps_per_execution=setup["steps_per_execution"],
            **run,
        )
        return model

    fit = dict(
        sample_weight=weights,
        batch_size=setup["batch_size"],
        epochs=2,
        shuffle=False,
        verbose=0,
    )
    with float64():
        plain, tower = twin(build, setup["towers"])
        histories = (plain.fit(x, y, **fit).history, tower.fit(x, y, **fit).history)
        batch = setup["batch_size"]
        predictions = [
            m.predict(x, batch_size=batch, verbose=0) for m in (plain, tower)
        ]
        scores = [m.evaluate(x, y, batch_size=batch, verbose=0) for m in (plain, tower)]
    assert_same(plain, tower, histories)
    np.testing.assert_allclose(
        predictions[1], predictions[0], rtol=TOLERANCE, atol=TOLERANCE
    )
    np.testing.assert_allclose(scores[1], scores[0], rtol=TOLERANCE, atol=TOLERANCE)
