"""Draws docs/img/benchmarks.svg from a benchmark run's JSON.

    python docs/img/benchmarks.py [bench/results/benchmarks.json]

Step time per training step for one device, TowerModel and stock
MirroredStrategy, per workload and compile setting, with the spread over
repeats. (`python -m bench` writes the JSON; its own PNG also shows the
targets the project tracks.)
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS = {
    "plain": "one device",
    "tower2": "TowerModel\n2 towers",
    "tower4": "TowerModel\n4 towers",
    "mirrored2": "MirroredStrategy\n2 replicas",
    "mirrored4": "MirroredStrategy\n4 replicas",
}
SUITES = {
    "default": "default",
    "jit": "jit_compile=True",
    "spe8": "steps_per_execution=8",
}
TITLES = {
    "mlp": "MLP, global batch 128 (a small step: fixed costs show)",
    "convnet": "Convnet, global batch 64 (arithmetic dominates)",
}


def main(path):
    results = json.loads(Path(path).read_text())
    suites = results["timing"]["suites"]
    machine = results["meta"]["machine"]
    plt.rcParams.update({"font.size": 12, "svg.fonttype": "none"})
    figure, axes = plt.subplots(2, 1, figsize=(9, 8.5))
    width = 0.8 / len(SUITES)
    for axis, (workload, title) in zip(axes, TITLES.items()):
        top = 0.0
        for s, (suite, label) in enumerate(SUITES.items()):
            variants = suites[f"{workload}/{suite}"]["variants"]
            for i, name in enumerate(VARIANTS):
                x = i + (s - (len(SUITES) - 1) / 2) * width
                result = variants.get(name, {})
                if "median_s" not in result or not result["median_s"]:
                    axis.text(x, 0.5, "fails", rotation=90, ha="center", fontsize=10)
                    continue
                median = 1e3 * result["median_s"]
                low, high = (1e3 * f(result["repeats_s"]) for f in (min, max))
                axis.bar(
                    x,
                    median,
                    width,
                    yerr=[[median - low], [high - median]],
                    capsize=2,
                    color=f"C{s}",
                    label=label if i == 0 else None,
                )
                top = max(top, high)
        axis.set_xticks(range(len(VARIANTS)), list(VARIANTS.values()))
        axis.set_ylim(0, top * 1.15)
        axis.set_ylabel("ms per training step")
        axis.set_title(title, fontsize=12)
        axis.legend(fontsize=10, loc="upper left")
    figure.suptitle(
        f"Median step time over {results['meta']['settings']['repeats']} repeats "
        "(bars: fastest and slowest repeat)\n"
        f"{machine['cpu_count']} CPU cores as 4 logical devices, "
        f"TensorFlow {machine['tensorflow']}, Keras {machine['keras']}",
        fontsize=12,
    )
    figure.tight_layout()
    out = HERE / "benchmarks.svg"
    figure.savefig(out, metadata={"Date": None})
    print(f"wrote {out}")


if __name__ == "__main__":
    default = HERE.parents[1] / "bench" / "results" / "benchmarks.json"
    main(sys.argv[1] if len(sys.argv) > 1 else default)
