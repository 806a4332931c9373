"""An evaluator beside training: each checkpoint evaluated as it lands.

    python examples/evaluator.py --dir /tmp/evaluator

runs ``kerastower launch -n 2 --towers 2 --evaluator`` on this script: two
workers train and the chief writes a checkpoint per epoch; the third process,
the cluster's ``"evaluator"`` task, evaluates each checkpoint on its own
towers while the workers go on, and stops once they have finished. Then this
script checks the evaluator's numbers against ``model.evaluate`` of a plain
`keras.Model` on each checkpoint. On a real cluster, run the part between
the markers on every task, with its own ``TF_CONFIG``.
"""

# --8<-- [start:script]
import argparse
import json
import os
import sys

import keras
import numpy as np

import kerastower


def build_model(model_class=kerastower.TowerModel):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    model = model_class(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def validation_data():
    x = np.random.default_rng(1).normal(size=(256, 8)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def run_task(directory):
    """What every task of the cluster runs: train, or evaluate."""
    filepath = os.path.join(directory, "ckpt", "{epoch:03d}.keras")  # shared
    model = build_model()
    if kerastower.cluster.is_evaluator():
        x_val, y_val = validation_data()
        evaluator = kerastower.evaluator.SidecarEvaluator(
            model,
            x_val,
            y_val,
            filepath=filepath,
            batch_size=64,
            log_dir=os.path.join(directory, "logs"),
            best_filepath=os.path.join(directory, "best.keras"),
        )
        evaluator.start()  # returns once training has ended
    else:
        rng = np.random.default_rng(0)
        x = kerastower.cluster.shard(rng.normal(size=(2048, 8)).astype("float32"))
        y = x.sum(axis=1, keepdims=True)
        checkpoint = kerastower.callbacks.ChiefCheckpoint(filepath)
        model.fit(x, y, batch_size=64, epochs=3, verbose=0, callbacks=[checkpoint])


# --8<-- [end:script]


def check(directory) -> float:
    """The largest relative difference between the evaluator's metrics and a
    plain model's `evaluate` of the same checkpoints on one device."""
    log = os.path.join(directory, "logs", kerastower.evaluator.LOG_NAME)
    with open(log) as lines:
        results = [json.loads(line) for line in lines]
    x_val, y_val = validation_data()
    worst = 0.0
    for result in results:
        plain = build_model(keras.Model)
        plain.load_weights(result["checkpoint"])
        expected = plain.evaluate(
            x_val, y_val, batch_size=64, verbose=0, return_dict=True
        )
        for name, value in expected.items():
            error = abs(result["metrics"][name] - value) / max(abs(value), 1.0)
            worst = max(worst, error)
        print(f"epoch {result['epoch']}: {result['metrics']}", flush=True)
    print(f"evaluated {len(results)} checkpoints", flush=True)
    return worst


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    if kerastower.cluster.tf_config() is not None:  # a task of the cluster
        run_task(args.dir)
        return 0
    from kerastower.launch import launch

    status = launch([__file__, "--dir", args.dir], 2, towers=2, evaluator=True)
    if status:
        return status
    worst = check(args.dir)
    print(f"max |evaluator - model.evaluate| / |model.evaluate| = {worst:.1e}")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
