"""Draw how a global batch is split over towers and how each tower's loss counts.

    python examples/plot_splitting.py --out docs/img/splitting.png

The sizes come from `kerastower.split_sizes`; the weights are the ones
`TowerModel` uses (``n_i / B``) and the ones a stock `MirroredStrategy` uses
(``1 / replicas``), per example.
"""

import argparse

import kerastower


def draw(axis, y, sizes, weights, title, colors, unit="tower"):
    start = 0
    for tower, (size, weight) in enumerate(zip(sizes, weights)):
        for k in range(size):
            axis.add_patch(
                plt_rectangle((start + k, y), 0.9, 0.8, color=colors[tower], alpha=0.85)
            )
            axis.text(
                start + k + 0.45,
                y + 0.4,
                f"{weight / size:.3g}" if size else "",
                ha="center",
                va="center",
                fontsize=8,
                color="white",
            )
        if size:
            axis.text(
                start + size / 2 - 0.05,
                y - 0.3,
                f"{unit} {tower}: n={size}, w={weight:.3g}",
                ha="center",
                va="center",
                fontsize=8,
            )
        start += size
    axis.text(-0.3, y + 0.4, title, ha="right", va="center", fontsize=9)


def plt_rectangle(*args, **kwargs):
    from matplotlib.patches import Rectangle

    return Rectangle(*args, **kwargs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="splitting.png")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    figure, axis = plt.subplots(figsize=(8.5, 3.4))
    rows = []
    for batch, towers in ((10, 3), (5, 2)):
        sizes = kerastower.split_sizes(batch, towers)
        rows.append(
            (
                f"TowerModel\nbatch {batch}, {towers} towers",
                sizes,
                [n / batch for n in sizes],
                "tower",
            )
        )
    rows.append(
        (
            "MirroredStrategy\nlast batch 5, 2 replicas",
            [3, 2],
            [0.5, 0.5],
            "replica",
        )
    )
    for row, (title, sizes, weights, unit) in enumerate(rows):
        draw(axis, -1.6 * row, sizes, weights, title, colors, unit)
    axis.set_xlim(-3.2, 10.2)
    axis.set_ylim(-1.6 * len(rows) + 0.8, 1.1)
    axis.axis("off")
    axis.set_title(
        "Each square is one example, labelled with its weight in the loss: "
        "one device gives every example 1/B",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
