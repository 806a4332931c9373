"""A worker script that can resume on another number of workers.

    python examples/resume_any_cluster.py --dir /tmp/resume
    kerastower launch -n 2 --towers 2 examples/resume_any_cluster.py --dir /tmp/resume

Every worker reads the same data and keeps its part
(`kerastower.cluster.shard`), fitting ``global_batch // W`` examples a step,
so each step's global batch holds the same examples for any number of
workers ``W`` that divides it. Stopped on some workers, the script resumes
from its backup on others and trains the same model.
"""

import argparse

# --8<-- [start:resume]
import keras
import numpy as np

import kerastower

x = np.random.default_rng(0).normal(size=(1200, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
inputs = keras.Input((8,))
model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
model.compile(optimizer="adam", loss="mse")

global_batch = 12  # 1, 2, 3, 4 or 6 workers
x_local, y_local = kerastower.cluster.shard((x, y))
backup_dir = "backup"
# --8<-- [end:resume]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--dir", default=backup_dir)
backup_dir = parser.parse_args().dir
# --8<-- [start:fit]
model.fit(
    x_local,
    y_local,
    batch_size=global_batch // kerastower.num_workers(),
    epochs=2,
    shuffle=False,
    verbose=0,
    callbacks=[kerastower.callbacks.BackupAndRestore(backup_dir, save_freq=50)],
)
# --8<-- [end:fit]
print(f"worker {kerastower.worker_index()} of {kerastower.num_workers()}: trained")
