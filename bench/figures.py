"""Figures of a ``python -m bench`` results dict, and the sentences that carry them.

The lookups (`ratio_rows`, `median_ms`) and `span` read a results dict
(``benchmarks.json``); `summary`, `traces`, `memory_sentence` and
`accumulation` write the sentences of the docs' Benchmarks page that hold
figures, so that none of them is typed by hand. `bench.page` puts them, with
the tables, into ``benchmarks.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Results = dict[str, Any]

# How the sentences name a workload; any other is named by its key.
NAMES = {"mlp": "MLP"}


def span(values: Iterable[float], digits: int = 2, joiner: str = " to ") -> str:
    """The range of `values` as text, both ends rounded to `digits` decimals.

    Example:

    ```python
    span([1.06, 1.2619]) == "1.06 to 1.26"
    span([2.37, 1.24], digits=1, joiner="-") == "1.2-2.4"
    span([0.999, 1.001]) == "1.00"
    ```

    Args:
        values: The numbers; at least one.
        digits: Decimals of both ends. Defaults to 2.
        joiner: The text between the ends. Defaults to ``" to "``.

    Returns:
        ``"<low><joiner><high>"``, or one number when both ends round alike.

    Raises:
        ValueError: `values` is empty.
    """
    values = list(values)
    if not values:
        raise ValueError(f"`values` must not be empty. Received: values={values}")
    low, high = (f"{f(values):.{digits}f}" for f in (min, max))
    return low if low == high else f"{low}{joiner}{high}"


def towers(results: Results) -> list[int]:
    """The tower counts ``N`` of the run, in the order measured."""
    return list(results["meta"]["settings"]["towers"])


def ratio_rows(
    results: Results,
    denominator: str,
    keep: Callable[[str], bool] | None = None,
) -> dict[tuple[str, int], dict]:
    """``{(suite, N): ratio row}`` of every ``towerN/<denominator>`` ratio.

    Args:
        results: A results dict.
        denominator: ``"plain"``, or a variant with ``N`` standing for the
            tower count (``"mirroredN"``, ``"mirrored_collN"``).
        keep: Selects suites by their config name (``"default"``, ``"jit"``,
            ``"spe8"``). Defaults to every suite.
    """
    names = {f"tower{n}/{denominator.replace('N', str(n))}": n for n in towers(results)}
    suites = results["timing"]["suites"]
    return {
        (row["suite"], names[row["name"]]): row
        for row in results["timing"]["ratios"]
        if row["name"] in names
        and (keep is None or keep(suites[row["suite"]]["config"]))
    }


def values(rows: dict, field: str = "ratio") -> list[float]:
    """`field` of every row of `ratio_rows` that has it (failed ones do not)."""
    return [row[field] for row in rows.values() if field in row]


def median_ms(results: Results, suite: str, variant: str) -> float | None:
    """A variant's median step time in ms, or None where it failed."""
    result = results["timing"]["suites"][suite]["variants"].get(variant, {})
    return 1e3 * result["median_s"] if "median_s" in result else None


def listed(items: list[str], last: str = " and ") -> str:
    """``"a, b and c"``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + last + items[-1]


def _jit(config: str) -> bool:
    return config == "jit"


def _not_jit(config: str) -> bool:
    return config != "jit"


def summary(results: Results) -> list[str]:
    """The "In short" bullets that step times, memory and accumulation give.

    Ranges are min to max over the suites: against stock Keras over every
    suite in which it ran; against one device over the suites without XLA
    (``jit_compile=True`` has a bullet of its own).
    """
    suites = results["timing"]["suites"]
    bullets = []

    stock = ratio_rows(results, "mirroredN")
    collective = values(ratio_rows(results, "mirrored_collN"))
    text = (
        "**Against stock `MirroredStrategy` on the same devices**, a `TowerModel` "
        f"step takes {span(values(stock))} times as long"
    )
    if collective:
        text += f" ({span(collective)} against its default collective all-reduce)"
    bullets.append(
        f"{text}, and a whole epoch {span(values(stock, 'epoch_wall_ratio'))} "
        "times as long (stock Keras also distributes the input pipeline every epoch)."
    )

    plain = ratio_rows(results, "plain", _not_jit)
    text = (
        "**Against one device on the same cores** (logical CPUs share the machine's "
        f"{results['meta']['machine']['cpu_count']} cores, so towers cannot be "
        "faster here)"
    )
    *fewer, n = towers(results)
    for m in fewer:
        ratios = values({key: row for key, row in plain.items() if key[1] == m})
        text += f", {m} towers take {span(ratios)} times one device's step"
    costs = []
    for workload in results["meta"]["settings"]["workloads"]:
        keys = [
            key
            for key, suite in suites.items()
            if suite["workload"] == workload and _not_jit(suite["config"])
        ]
        times = [
            (median_ms(results, key, "plain"), median_ms(results, key, f"tower{n}"))
            for key in keys
        ]
        times = [(one, many) for one, many in times if None not in (one, many)]
        ratios = values({key: plain[key, n] for key in keys if (key, n) in plain})
        if times and ratios:
            costs.append(
                f"{span((many - one for one, many in times), 1)} ms to a "
                f"{span((one for one, _ in times), 1, '-')} ms "
                f"{NAMES.get(workload, workload)} step ({span(ratios)})"
            )
    bullets.append(
        f"{text}. {n} towers add {' and '.join(costs)}; "
        "[Where the time goes](#where-the-time-goes) takes it apart for the MLP. "
        "On GPUs, which run the towers in parallel, this is the overhead to set "
        "against the speed-up; GPU runs are not part of these numbers."
    )

    memory = [
        row["ratio"]
        for row in results["memory"]["ratios"]
        if row["name"] in {f"tower{m}/plain" for m in towers(results)}
    ]
    if memory:
        within = 100 * max(abs(ratio - 1) for ratio in memory)
        bullets.append(
            "**Memory:** one copy of the weights, as on one device; the peak "
            f"memory of the whole process is within {within:.1f}% of one device's."
        )

    jit = values(ratio_rows(results, "plain", _jit))
    if jit:
        stock_jit = [
            variant
            for suite in suites.values()
            if _jit(suite["config"])
            for name, variant in suite["variants"].items()
            if name.startswith("mirrored")
        ]
        text = (
            f"**`jit_compile=True`** trains exactly with towers, at {span(jit)} "
            "times one device's step, but on one device: the whole step, towers "
            "included, is one XLA computation, and XLA ignores the towers' "
            "placements inside it, so every op runs on the first device "
            "(TensorFlow's executor log; a warning says so)."
        )
        if stock_jit and all("error" in variant for variant in stock_jit):
            text += " Stock `MirroredStrategy` fails with it on logical CPUs."
        bullets.append(text)

    run = results.get("accumulation", {})
    if run.get("status") == "measured":
        change = 100 * (run["ratio"] - 1)
        verb = "costs" if change >= 0 else "saves"
        bullets.append(
            f"**Gradient accumulation** {verb} about {abs(change):.0f}% per micro-step."
        )
    return [f"- {bullet}" for bullet in bullets]


def traces(results: Results) -> list[str]:
    """How often each variant traced its train step, as one sentence."""
    run = results["traces"]
    batch, examples = run["batch_size"], run["examples"]
    sizes = [batch] * (examples // batch) + (
        [examples % batch] if examples % batch else []
    )
    names: dict[int, list[str]] = {}
    at_start: dict[int, bool] = {}
    failed = []
    for name, value in run["variants"].items():
        if "traces" not in value:
            failed.append(f"`{name}`")
            continue
        count = value["traces"]
        names.setdefault(count, []).append(f"`{name}`")
        start = all(list(at) == [0, 0] for at in value["traced_at"])
        at_start[count] = at_start.get(count, True) and start
    words = {1: "once", 2: "twice"}
    parts = []
    for count in sorted(names):
        part = f"{words.get(count, f'{count} times')} for {listed(names[count])}"
        if count > 1 and at_start[count]:
            part += " (each time at epoch 0, batch 0)"
        parts.append(part)
    if failed:
        parts.append(f"not at all for {listed(failed)}, which failed")
    return [
        f"A {run['epochs']}-epoch `fit` of {examples} examples with global batch "
        f"{batch} (batches of {listed([str(size) for size in sizes])}) traces the "
        f"train step {listed(parts, ', and ')}."
    ]


def memory_sentence(results: Results) -> list[str]:
    """What towers and stock Keras add to one device's peak memory, in MiB.

    For the first workload with a ``floor``, ``plain`` and the largest
    ``mirroredN``; empty when there is none (smoke runs).
    """
    peaks = {
        key: value["peak_rss_mib"]
        for key, value in results["memory"]["peak_rss"].items()
        if "peak_rss_mib" in value
    }
    n = towers(results)[-1]
    for workload in dict.fromkeys(key.split("/")[0] for key in peaks):
        needed = {"floor", "plain", f"tower{n}", f"mirrored{n}"}
        if not {f"{workload}/{name}" for name in needed} <= set(peaks):
            continue
        peak = {name: peaks[f"{workload}/{name}"] for name in needed}
        added = [
            peaks[f"{workload}/tower{m}"] - peak["plain"]
            for m in towers(results)
            if f"{workload}/tower{m}" in peaks
        ]
        return [
            f"On the {NAMES.get(workload, workload)}, towers add {span(added, 0)} "
            f"MiB to one device's {peak['plain'] - peak['floor']:.0f} MiB above "
            f"the floor, and stock `mirrored{n}` adds "
            f"{peak[f'mirrored{n}'] - peak[f'tower{n}']:.0f} MiB more than "
            f"`tower{n}`."
        ]
    return []


def accumulation(results: Results) -> list[str]:
    """The accumulation benchmark as one paragraph."""
    run = results.get("accumulation", {})
    if run.get("status") != "measured":
        return [
            "Not measured: `kerastower.callbacks.GradientAccumulation` was not "
            "available."
        ]
    k = run["accumulation_steps"]
    median = run["median_s"]
    return [
        f"One micro-step of `TowerModel(towers={run['towers']})` with "
        f"[`GradientAccumulation({k})`][kerastower.callbacks.GradientAccumulation] "
        "against a step of the same model without it, on the "
        f"{NAMES.get(run['workload'], run['workload'])} at the same global "
        f"micro-batch of {run['micro_batch_size']} (mean over all steps, since "
        f"one step in {k} applies the update): ratio {run['ratio']:.2f} "
        f"({1e3 * median['accumulated']:.2f} ms against {1e3 * median['plain']:.2f} "
        f"ms; the per-repeat ratios spread from {span(run['per_repeat'])} on this "
        "machine)."
    ]
