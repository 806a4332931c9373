"""Every example runs (tiny epochs), and every code block of the docs is an example.

Each example is a script that checks its own result against one device (or
an uninterrupted run) and exits non-zero when it does not match; here each
runs in a fresh process, since each configures its own logical devices.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from processes import checkout_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"

# Script -> (arguments, text its output must contain). "{tmp}" is a fresh folder.
RUNS = {
    "quickstart.py": ([], "4 towers: ['/device:CPU:0'"),
    "digits_convnet.py": (
        ["--epochs", "1", "--towers", "3", "--log-dir", "{tmp}/logs"],
        "global batch 30 -> per tower [10, 10, 10]",
    ),
    "custom_compute_loss.py": (["--epochs", "1"], "max |w_towers - w_one_device|"),
    "dcgan_towers.py": (["--epochs", "1"], "max |w_towers - w_one_device|"),
    "gradient_accumulation.py": (
        ["--epochs", "1"],
        "optimizer steps: 5 with accumulation, 5 on one device",
    ),
    "checkpoint_resume.py": (
        ["--epochs", "3", "--crash-after", "1", "--dir", "{tmp}"],
        "resumed run trained epochs 2 to 3",
    ),
    "preemption.py": (
        ["--dir", "{tmp}"],
        "max |w_resumed - w_uninterrupted| = 0.0e+00",
    ),
    "one_machine.py": (["--epochs", "1"], "predicts the same: True"),
    "batch_scaling.py": (
        ["--epochs", "2"],
        "at the end of warmup: 0.04 = lr_target 0.04",
    ),
    "migrate_mirrored_strategy.py": (["--epochs", "1"], "TowerModel:"),
    "stock_keras_gap.py": (["--epochs", "1", "--quick"], "crash: InvalidArgumentError"),
    "plot_tower_monitor.py": (
        ["--epochs", "1", "--out", "{tmp}/monitor.png"],
        "monitor.png",
    ),
    "plot_splitting.py": (["--out", "{tmp}/splitting.png"], "splitting.png"),
    "evaluator.py": (["--dir", "{tmp}"], "evaluated 3 checkpoints"),
    "resume_any_cluster.py": (["--dir", "{tmp}/backup"], "worker 0 of 1: trained"),
    "five_minutes.py": ([], "same as one device"),
    # The guide "Check your own model"; each exits 1 on a wrong verdict.
    "check_your_model/functional.py": ([], "float64, 3 towers"),
    "check_your_model/subclassed.py": ([], "same as one device"),
    "check_your_model/options.py": ([], "same as one device"),
    "check_your_model/coupled_loss.py": ([], "global_batch_loss=True"),
}
COVERED_ELSEWHERE = {"multi_worker.py": "tests/test_multi_worker.py runs it"}

# Pages whose code blocks are written inline by their authors (not yet
# included from examples/); every other page may only include examples.
INLINE_CODE_PAGES = {"benchmarks.md"}


def run(args, timeout=300):
    env = checkout_env(TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_every_example_is_run():
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    scripts |= {
        f"check_your_model/{p.name}" for p in EXAMPLES.glob("check_your_model/*.py")
    }
    assert scripts == set(RUNS) | set(COVERED_ELSEWHERE)


# Examples that start processes of their own: `slow` (`nox -s slow`).
SEVERAL_PROCESSES = {"evaluator.py"}


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(s, marks=pytest.mark.slow) if s in SEVERAL_PROCESSES else s
        for s in sorted(RUNS)
    ],
)
def test_example_runs(script, tmp_path):
    args, expected = RUNS[script]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = run([str(EXAMPLES / script), *args])
    assert expected in out, out[-3000:]
    for path in args:
        if path.endswith(".png"):
            assert Path(path).stat().st_size > 10_000


def test_testing_on_cpus_example_passes():
    out = run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/testing_on_cpus"]
    )
    assert "2 passed" in out


def python_blocks(text):
    return re.findall(r"^```python[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def without_noqa(text):
    return re.sub(r"  # noqa: \w+", "", text)


def test_readme_python_blocks_are_examples():
    # The README cannot include files, so its code is a verbatim copy of an
    # example (less the linter's noqa comments), which test_example_runs runs.
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks
    sources = [without_noqa(p.read_text()) for p in EXAMPLES.glob("*.py")]
    for block in blocks:
        assert any(block in source for source in sources), block


def test_docs_code_blocks_are_included_examples():
    pages = sorted(DOCS.rglob("*.md"))
    assert pages
    for page in pages:
        name = page.relative_to(DOCS).as_posix()
        if name in INLINE_CODE_PAGES:
            continue
        for block in python_blocks(page.read_text()):
            lines = [line.strip() for line in block.strip().splitlines()]
            for line in lines:
                match = re.fullmatch(r'--8<-- "(examples/[^":]+)(?::(\w+))?"', line)
                assert match, f"{name}: code block is not an included example:\n{block}"
                source = (ROOT / match.group(1)).read_text()
                if match.group(2):
                    assert f"--8<-- [start:{match.group(2)}]" in source, line


def test_no_folder_shadows_a_package_that_keras_imports():
    # A script's folder is first on `sys.path`: a folder `examples/jax/`
    # (no `__init__.py`) once imported as an empty namespace package `jax`
    # where jax is not installed, and Keras and TensorFlow, which try
    # `import jax`, failed in every example and worker script.
    packages = {"jax", "jaxlib", "keras", "tensorflow", "tf_keras", "torch", "numpy"}
    shadows = sorted(
        str(path.relative_to(ROOT))
        for top in ("examples", "tests", "bench", "docs")
        for path in (ROOT / top).rglob("*")
        if path.is_dir() and path.name in packages
    )
    assert shadows == []
