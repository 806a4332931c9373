"""From `keras.distribution.DataParallel` to `TowerModel`, on Keras's JAX backend.

Run: ``KERAS_BACKEND=jax python examples/on_jax/migrate_data_parallel.py``
(four CPU devices of JAX's own when there is no GPU; needs
``pip install ".[jax]"``). Trains the same model three ways on 102 examples,
global batch 32 (three batches and a last one of 6, which 4 devices do not
divide): under `DataParallel`, which refuses the last batch; as a
`TowerModel`; and as a plain `keras.Model` on one device, the oracle. Checks
that the `TowerModel` ends with the plain model's weights (float64) and
exits 1 when it does not.
"""

# --8<-- [start:setup]
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
# Before JAX starts: four CPU devices when there is no GPU.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64, for an exact comparison

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerastower  # noqa: E402

keras.config.set_floatx("float64")
keras.config.set_dtype_policy("float64")
rng = np.random.default_rng(0)
x = rng.normal(size=(102, 8))
y = (x @ rng.normal(size=(8, 1))).astype("float64")


def layers():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(1)(hidden)


# --8<-- [end:setup]

# --8<-- [start:before]
# Before: Keras's own data parallelism, set for the whole program.
distribution = keras.distribution.DataParallel()  # every device
keras.distribution.set_distribution(distribution)
model = keras.Model(*layers())
model.compile(optimizer="adam", loss="mse")
try:
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
except Exception as error:  # the last batch of 6 does not divide by 4
    print(f"DataParallel: {type(error).__name__} on the last batch")
keras.distribution.set_distribution(None)
# --8<-- [end:before]

# --8<-- [start:after]
# After: the same model as a TowerModel; any batch size, nothing global.
model = kerastower.TowerModel(*layers())  # towers=None: every device
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
# --8<-- [end:after]

one_device = keras.Model(*layers())
one_device.compile(optimizer="adam", loss="mse")
one_device.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
difference = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(model.get_weights(), one_device.get_weights(), strict=True)
)
same = difference < 1e-12
print(
    f"TowerModel on {model.num_towers} devices ({', '.join(model.tower_devices)}): "
    f"max |w_towers - w_one_device| = {difference:.1e}: "
    + ("same as one device" if same else "DIFFERENT from one device")
)
raise SystemExit(0 if same else 1)
