"""The keras.io DCGAN with its own `train_step`, on towers and exactly as on one device.

The GAN of keras.io's "DCGAN: overriding `train_step`" (tiny: 8x8 images)
takes its discriminator's and generator's gradients with
`TowerModel.tower_gradients`, so each step is split over 4 towers. It trains
from the same weights, with the same random draws and data, as the keras.io
GAN with its `tf.GradientTape` code on one device, and checks that the
weights and losses agree:

    python examples/dcgan_towers.py --epochs 2
"""

import argparse

# --8<-- [start:imports]
import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

import kerastower

kerastower.configure_logical_devices(4)  # without GPUs: 4 logical CPUs as towers
# --8<-- [end:imports]

# --8<-- [start:gan]
LATENT_DIM = 8


def build_discriminator():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(8, 3, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, 3, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Flatten(),
            layers.Dense(1, activation="sigmoid"),
        ],
        name="discriminator",
    )


def build_generator():
    return keras.Sequential(
        [
            keras.Input((LATENT_DIM,)),
            layers.Dense(4 * 4 * 16),
            layers.Reshape((4, 4, 16)),
            layers.Conv2DTranspose(16, 4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )


class GAN(keras.Model):
    """The keras.io GAN: its `train_step` runs on one device."""

    def __init__(self, discriminator, generator, latent_dim, **kwargs):
        super().__init__(**kwargs)
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            (batch_size, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate(
            [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
        )
        # Noisy labels; keras.io draws them unseeded with tf.random.uniform.
        labels += 0.05 * keras.random.uniform(
            ops.shape(labels), seed=self.seed_generator
        )
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )

        random_latent_vectors = keras.random.normal(
            (batch_size, self.latent_dim), seed=self.seed_generator
        )
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}


# --8<-- [end:gan]


# --8<-- [start:tower_gan]
class TowerGAN(kerastower.TowerModel):
    """The keras.io GAN with its two backward passes split over the towers."""

    def __init__(self, discriminator, generator, latent_dim, **kwargs):
        super().__init__(**kwargs)  # kwargs: `towers=...` among others
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        # Random draws on the whole global batch, before the towers, so that
        # the split cannot change them: the same draws as on one device.
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            (batch_size, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate(
            [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
        )
        labels += 0.05 * keras.random.uniform(
            ops.shape(labels), seed=self.seed_generator
        )

        def discriminator_loss(images, labels):  # the mean over one tower's shard
            return self.loss_fn(labels, self.discriminator(images))

        grads, d_loss = self.tower_gradients(
            discriminator_loss,
            self.discriminator.trainable_weights,
            combined_images,  # 2 * batch_size examples, split over the towers
            labels,
        )
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )

        random_latent_vectors = keras.random.normal(
            (batch_size, self.latent_dim), seed=self.seed_generator
        )
        misleading_labels = ops.zeros((batch_size, 1))

        def generator_loss(latent_vectors, labels):
            predictions = self.discriminator(self.generator(latent_vectors))
            return self.loss_fn(labels, predictions)

        grads, g_loss = self.tower_gradients(
            generator_loss,
            self.generator.trainable_weights,
            random_latent_vectors,
            misleading_labels,
        )
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}


# --8<-- [end:tower_gan]


def make_images(n, seed=0):
    """``n`` 8x8 grey images of a bright bar, row or column, with some noise."""
    rng = np.random.default_rng(seed)
    images = 0.1 * rng.random((n, 8, 8, 1))
    for image, position, vertical in zip(
        images, rng.integers(0, 8, n), rng.random(n) < 0.5
    ):
        if vertical:
            image[:, position] += 0.8
        else:
            image[position] += 0.8
    return images.astype("float32")


def train(cls, images, epochs, batch_size=5, run_eagerly=False, **kwargs):
    """Trains a GAN of class `cls` from seeded weights; returns it and its logs.

    The logs are the ``d_loss`` and ``g_loss`` Keras reports after every step.
    """
    keras.utils.set_random_seed(0)  # the same initial weights for every run
    gan = cls(
        discriminator=build_discriminator(),
        generator=build_generator(),
        latent_dim=LATENT_DIM,
        **kwargs,
    )
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )
    gan.run_eagerly = run_eagerly
    history = {"d_loss": [], "g_loss": []}
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: [
            history[key].append(float(logs[key])) for key in history
        ]
    )
    gan.fit(
        images,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[record],
    )
    return gan, history


def weight_difference(a, b):
    """The largest difference between two GANs' weights."""
    return max(
        float(np.max(np.abs(u - v)))
        for u, v in zip(
            a.discriminator.get_weights() + a.generator.get_weights(),
            b.discriminator.get_weights() + b.generator.get_weights(),
            strict=True,
        )
    )


def log_difference(a, b):
    """The largest difference between two runs' ``d_loss`` and ``g_loss`` logs."""
    return max(
        float(np.max(np.abs(np.subtract(a[key], b[key]))))
        for key in ("d_loss", "g_loss")
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--towers", type=int, default=4)
    args = parser.parse_args(argv)

    # 23 images in global batches of 5: the discriminator splits 10 examples
    # as [3, 3, 2, 2] and the generator 5 as [2, 1, 1, 1]; the last batch of
    # 3 leaves the generator's fourth tower empty.
    images = make_images(23)
    plain, plain_logs = train(GAN, images, args.epochs)
    towered, tower_logs = train(TowerGAN, images, args.epochs, towers=args.towers)
    weights = weight_difference(plain, towered)
    losses = log_difference(plain_logs, tower_logs)
    for name, logs in (
        ("one device", plain_logs),
        (f"{args.towers} towers", tower_logs),
    ):
        print(
            f"{name}: d_loss {logs['d_loss'][-1]:.6f}, g_loss {logs['g_loss'][-1]:.6f}"
        )
    print(f"max |w_towers - w_one_device| = {weights:.1e} (generator, discriminator)")
    print(f"max |loss_towers - loss_one_device| = {losses:.1e} (every step)")
    if weights > 1e-5 or losses > 1e-5:
        raise SystemExit("the towers did not match one device")


if __name__ == "__main__":
    main()
