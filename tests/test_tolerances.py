"""Every float comparison in the tests and examples names its tolerance.

Towers add the same numbers in another order than one device, so the last
float32 bit of a loss or weight depends on the CPU's kernels: a comparison at
`numpy.testing.assert_allclose`'s default ``rtol=1e-7`` passes on one machine
and fails on the next. Comparisons use `oracle.assert_close` (the project's
1e-5) or pass ``rtol``/``atol`` explicitly; this test fails on any that does
not.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPARISONS = {
    "assert_allclose",
    "allclose",
    "isclose",
    "assert_almost_equal",
    "assert_array_almost_equal",
}
TOLERANCES = {"rtol", "atol", "decimal"}


def untolerant_comparisons(source: str) -> list[int]:
    """Returns the lines of float comparisons that rely on a default tolerance."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        keywords = {k.arg for k in node.keywords}
        if name in COMPARISONS and not TOLERANCES & keywords:
            lines.append(node.lineno)
    return lines


def python_files():
    for folder in ("tests", "examples", "bench"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_the_check_catches_a_default_tolerance():
    assert untolerant_comparisons("np.testing.assert_allclose(a, b)\n") == [1]
    assert untolerant_comparisons("np.allclose(a,\n b, rtol=1e-5)\n") == []
    assert untolerant_comparisons("x = np.isclose(a, b)\n") == [1]


@pytest.mark.parametrize(
    "path", list(python_files()), ids=lambda p: str(p.relative_to(ROOT))
)
def test_float_comparisons_name_a_tolerance(path):
    lines = untolerant_comparisons(path.read_text())
    assert not lines, (
        f"{path.relative_to(ROOT)} compares floats at a default tolerance on "
        f"lines {lines}: use oracle.assert_close or pass rtol/atol explicitly"
    )
