"""The hypothesis space that the tower-equivalence properties of both
backends draw from (tests/properties, tests/on_jax): plain Python, importing
neither TensorFlow nor JAX."""

from hypothesis import strategies as st


def optimizers(keras) -> dict:
    """The optimizers drawn, as factories of `keras`'s optimizers."""
    return {
        "sgd": lambda: keras.optimizers.SGD(0.05),
        "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "rmsprop_clip": lambda: keras.optimizers.RMSprop(0.01, clipnorm=0.5),
    }


OPTIMIZER_NAMES = sorted(optimizers(None))


@st.composite
def fits(draw) -> dict:
    """One fit: towers, global batch, samples, optimizer, sample weights, seed."""
    return {
        "towers": draw(st.integers(1, 4)),
        "batch_size": draw(st.integers(1, 33)),
        "samples": draw(st.integers(1, 40)),
        "optimizer": draw(st.sampled_from(OPTIMIZER_NAMES)),
        "weighted": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }
