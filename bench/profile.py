"""Where a tower step spends its time: ``python -m bench.profile``.

Views of the same workload, for a plain model and `TowerModel` with 2
and 4 towers:

- batch scaling: step time at global batch sizes 16, 128 and 512, which
  separates a fixed cost per step from a cost per example;
- graph size: the ops of one traced train step, and the devices they run on;
- TensorFlow profiler: per-op time on TensorFlow's compute threads over one
  timed epoch, read from the profiler's ``.xplane.pb`` file;
- bare TensorFlow (the MLP): the extra time of 4 towers beside the extra
  time of the same 4-way split as a bare `tf.function`, the floor that
  TensorFlow's multi-device runtime sets, with ``steps_per_execution`` 1
  and 8.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

STEPS = 48


def batch_scaling(workload, variants, batch_sizes=(16, 128, 512), repeats=5):
    """Median ms per step of each variant at each global batch size."""
    from bench.timing import time_epoch
    from bench.workloads import build_variant

    table = {}
    for batch_size in batch_sizes:
        sized = dataclasses.replace(workload, batch_size=batch_size)
        x, y = sized.data(32)
        models = {v.name: build_variant(sized, v) for v in variants}
        for model in models.values():
            time_epoch(model, x, y, batch_size)
        times = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                times[name].append(time_epoch(model, x, y, batch_size)[0])
        table[batch_size] = {n: 1e3 * statistics.median(t) for n, t in times.items()}
        print(
            f"batch {batch_size:4d}: "
            + ", ".join(f"{n} {t:.2f} ms" for n, t in table[batch_size].items())
        )
    return table


def graph_size(workload, variants):
    """Ops of one traced train step (library functions included), by device."""
    import tensorflow as tf

    from bench.workloads import build_variant

    x, y = workload.data(1)
    for variant in variants:
        model = build_variant(workload, variant)
        model.fit(x, y, batch_size=workload.batch_size, epochs=1, verbose=0)
        spec = (
            tf.TensorSpec((None, *workload.input_shape), tf.float32),
            tf.TensorSpec((None,), tf.int32),
        )

        def step(a, b, model=model):
            return model.distribute_strategy.run(model.train_step, args=((a, b),))

        graph = tf.function(step).get_concrete_function(*spec).graph.as_graph_def()
        nodes = list(graph.node)
        nodes += [n for f in graph.library.function for n in f.node_def]
        devices = collections.Counter(
            n.device.split("device:")[-1] if n.device else "unplaced" for n in nodes
        )
        print(f"{variant.name:>10}: {len(nodes)} ops; by device {dict(devices)}")


def op_profile(workload, variants, top=8):
    """Per-op time on TensorFlow's compute threads, per step, from the profiler."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from bench.timing import time_epoch
    from bench.workloads import build_variant

    x, y = workload.data(STEPS)
    for variant in variants:
        model = build_variant(workload, variant)
        time_epoch(model, x, y, workload.batch_size)
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            step, _ = time_epoch(model, x, y, workload.batch_size)
            tf.profiler.experimental.stop()
            (path,) = Path(logdir).rglob("*.xplane.pb")
            space = xplane_pb2.XSpace.FromString(path.read_bytes())
        (plane,) = [p for p in space.planes if p.name == "/host:CPU"]
        names = {k: v.name for k, v in plane.event_metadata.items()}
        busy, per_op, count = 0.0, collections.Counter(), collections.Counter()
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                ms = event.duration_ps / 1e9 / STEPS
                if name == "ExecutorState::Process":
                    busy += ms
                else:
                    kind = name.split(":")[-1]
                    per_op[kind] += ms
                    count[kind] += 1 / STEPS
        print(
            f"{variant.name:>10}: {1e3 * step:.2f} ms/step wall; compute threads "
            f"busy {busy:.2f} ms/step; {sum(count.values()):.0f} op runs/step"
        )
        for kind, ms in per_op.most_common(top):
            print(f"{'':12}{kind:32} {ms:6.3f} ms/step  x{count[kind]:.0f}")


def bare_tensorflow(workload, towers=4, repeats=15, steps_per_execution=1):
    """The fixed cost of towers against the same split in bare TensorFlow.

    Times, interleaved in one process, a plain model and
    `TowerModel(towers=towers)` (ms per step), and the same MLP's gradient
    and momentum-SGD update as a bare `tf.function`, unsplit and cut into
    `towers` shards on `towers` logical devices (the MLP only). The extra
    time of the bare split is what TensorFlow's multi-device runtime costs
    without Keras or kerastower: one executor per device, the weights sent
    to every tower and the gradients back, smaller matrix products.

    With ``steps_per_execution > 1`` the models are compiled with it and
    the bare step runs in a ``tf.range`` loop of as many steps inside one
    `tf.function`, the way Keras loops over a multi-step execution (each
    step a nested `tf.function` call).
    """
    import numpy as np
    import tensorflow as tf

    from bench.timing import time_epoch
    from bench.workloads import Variant, build_variant

    x, y = workload.data(STEPS)
    spe = steps_per_execution
    models = {
        "plain": build_variant(workload, Variant("plain", steps_per_execution=spe)),
        f"tower{towers}": build_variant(
            workload, Variant("tower", towers, steps_per_execution=spe)
        ),
    }
    for model in models.values():
        time_epoch(model, x, y, workload.batch_size)
    weights = [tf.Variable(w) for w in models["plain"].get_weights()]
    velocity = [tf.Variable(tf.zeros_like(w)) for w in weights]

    def gradients(inputs, labels):
        with tf.GradientTape() as tape:
            h = inputs
            for k in range(0, len(weights) - 2, 2):
                h = tf.nn.relu(h @ weights[k] + weights[k + 1])
            logits = h @ weights[-2] + weights[-1]
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            )
        return tape.gradient(loss, weights)

    def bare_step(shards):
        @tf.function
        def step(inputs, labels):
            per_shard = []
            for i, (a, b) in enumerate(
                zip(tf.split(inputs, shards), tf.split(labels, shards))
            ):
                with tf.device(f"/CPU:{i}"):
                    per_shard.append(gradients(a, b))
            for w, v, *g in zip(weights, velocity, *per_shard):
                v.assign(0.9 * v - 0.01 * tf.add_n(g) / shards)
                w.assign_add(v)

        @tf.function
        def execution(inputs, labels):
            for k in tf.range(spe):
                step(inputs[k], labels[k])

        return execution

    bare = {"bare1": bare_step(1), f"bare{towers}": bare_step(towers)}
    n = spe * workload.batch_size
    batches = (
        tf.constant(x[:n].reshape(spe, workload.batch_size, *x.shape[1:])),
        tf.constant(y[:n].reshape(spe, workload.batch_size)),
    )
    for execution in bare.values():
        execution(*batches)
    times = {name: [] for name in [*models, *bare]}
    calls = max(1, STEPS // spe)
    for _ in range(repeats):
        for name, model in models.items():
            times[name].append(1e3 * time_epoch(model, x, y, workload.batch_size)[0])
        for name, execution in bare.items():
            start = time.perf_counter()
            for _ in range(calls):
                execution(*batches)
            times[name].append(1e3 * (time.perf_counter() - start) / (calls * spe))
    t = {name: np.array(v) for name, v in times.items()}
    tower, split = f"tower{towers}", f"bare{towers}"
    print(
        f"steps_per_execution={spe}: "
        + ", ".join(f"{n} {np.median(v):.2f} ms" for n, v in t.items())
        + f"\n{tower}/plain {np.median(t[tower] / t['plain']):.2f} "
        f"(+{np.median(t[tower] - t['plain']):.2f} ms); "
        f"{split}/bare1 {np.median(t[split] / t['bare1']):.2f} "
        f"(+{np.median(t[split] - t['bare1']):.2f} ms)"
    )
    return t


def main() -> None:
    """Parses the command line and prints the three views."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--workload", default="mlp")
    args = parser.parse_args()

    import kerastower

    kerastower.configure_logical_devices(4)
    from bench.workloads import WORKLOADS, Variant

    workload = WORKLOADS[args.workload]
    variants = [Variant("plain"), Variant("tower", 2), Variant("tower", 4)]
    print(f"== {workload.description}\n-- batch scaling")
    batch_scaling(workload, [*variants, Variant("mirrored", 2)])
    print("-- graph size")
    graph_size(workload, [*variants, Variant("mirrored", 2)])
    print("-- TensorFlow profiler")
    op_profile(workload, variants)
    if args.workload == "mlp":
        print("-- against the same split in bare TensorFlow")
        bare_tensorflow(workload)
        bare_tensorflow(workload, steps_per_execution=8)


if __name__ == "__main__":
    main()
