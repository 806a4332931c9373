"""The user pages read as a manual, not as a development log.

Every Markdown page under ``docs/`` is read as prose (fenced code blocks and
``--8<--`` include lines left out; includes are not expanded) and fails on:

- a git commit hash: 7 to 40 hex digits, in backticks or standing alone as a
  word (``a4a51cc``, ``a4a51cc+dirty``), with at least one digit and one
  letter a-f, so that words (``decade``) and numbers (``1234567``,
  ``0.0596068``, ``1e-12``, ``float16``) pass; an all-digit one is caught
  after "commit", and "before `<hash>`" by its hash;
- "session(s)" as a work session. "nox session(s)" is the tool's word and
  passes (``nox -s`` has no "session" in it);
- a date, ``YYYY-MM-DD``.

Allowed:

- a date in a version heading of ``docs/changelog.md``
  (``## [0.1.0] - 2026-12-01``);
- a date in a generated table between ``<!-- name:start -->`` and
  ``<!-- name:end -->`` markers (the matrix tables of
  ``docs/installation.md``, written by ``python noxfile.py --docs``): it
  is the caption's date, like the captions below. A hash there still fails;
- the captions of benchmark tables, which live in generated files the pages
  include: ``docs/snippets/`` and ``bench/results/*.md`` are not read;
- in ``docs/benchmarks.md``, the sentences that date the included
  ``trace.md``, ``steady.md`` and ``traffic.md`` tables ("Measured on the machine above,
  <date>, commit `<hash>`", or "on another machine (<cpu>, <n> cores)", and
  "These numbers were measured on <date>"):
  ``tests/test_benchmarks_page.py`` checks them against the results' JSON.
"""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
SKIPPED = ("snippets",)  # generated benchmark tables and their captions

HEX = r"[0-9a-f]{7,40}"
# Not part of a longer word or of a number (0.0596068, 1e-12, 12ab345.6).
HASH = re.compile(rf"(?<![\w.]){HEX}(?!\w|\.\d)", re.I)
AFTER_COMMIT = re.compile(rf"\bcommits?\s+`?({HEX})\b", re.I)
DATE = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
SESSION = re.compile(r"(?<![\w.])sessions?\b", re.I)
NOX_SESSION = re.compile(r"\bnox`?\s+$")
VERSION_HEADING = re.compile(
    r"^##\s+\[?\d+\.\d+\.\d+\w*\]?\s+-\s+\d{4}-\d{2}-\d{2}\s*$"
)
GENERATED = re.compile(r"<!-- ([-\w]+):start -->.*?<!-- \1:end -->", re.S)
CAPTIONS = {
    "benchmarks.md": re.compile(
        r"Measured\s+on\s+(?:the\s+machine\s+above|another\s+machine\s+\((?s:.*?)"
        rf"\s+cores\)),\s+\d{{4}}-\d{{2}}-\d{{2}},"
        rf"\s+commit\s+`{HEX}`"
        r"|These\s+numbers\s+were\s+measured\s+on\s+\d{4}-\d{2}-\d{2}"
    ),
}


def _prose(text: str) -> str:
    """The page with code blocks and include lines blanked, lines kept."""
    lines, fence = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and marker:
            fence = marker.group(1)
            lines.append("")
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            lines.append("")
        elif stripped.startswith("--8<--"):
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def _is_hash(token: str) -> bool:
    return bool(re.search(r"\d", token) and re.search(r"[a-f]", token, re.I))


def offences(name: str, text: str) -> list[tuple[int, str, str]]:
    """(line, what, matched text) for each log-like phrase of a page.

    ``name`` is the page's path under ``docs/`` (``guides/one-machine.md``).
    """
    prose = _prose(text)
    allowed = []  # spans where a date may stand
    hash_allowed = []  # spans where a hash may stand too
    for match in GENERATED.finditer(prose):
        allowed.append(match.span())
    if name in CAPTIONS:
        for match in CAPTIONS[name].finditer(prose):
            allowed.append(match.span())
            hash_allowed.append(match.span())
    if name == "changelog.md":
        start = 0
        for line in prose.splitlines(keepends=True):
            if VERSION_HEADING.match(line):
                allowed.append((start, start + len(line)))
            start += len(line)

    def inside(span, spans):
        return any(a <= span[0] and span[1] <= b for a, b in spans)

    found = {}
    for match in HASH.finditer(prose):
        if _is_hash(match.group()) and not inside(match.span(), hash_allowed):
            found[match.start()] = ("commit hash", match.group())
    for match in AFTER_COMMIT.finditer(prose):
        if not inside(match.span(), hash_allowed):
            found[match.start(1)] = ("commit hash", match.group(1))
    for match in DATE.finditer(prose):
        if not inside(match.span(), allowed):
            found[match.start()] = ("date", match.group())
    for match in SESSION.finditer(prose):
        if not NOX_SESSION.search(prose[max(0, match.start() - 8) : match.start()]):
            found[match.start()] = ("work session", match.group())
    return sorted(
        (prose.count("\n", 0, start) + 1, what, phrase)
        for start, (what, phrase) in found.items()
    )


def _pages():
    for path in sorted(DOCS.rglob("*.md")):
        relative = path.relative_to(DOCS)
        if relative.parts[0] not in SKIPPED:
            yield relative


@pytest.mark.parametrize(
    "text",
    [
        "Run on commit a4a51cc, a4a51cc+dirty.",
        "Before `f1d98d6` it grew.",
        "measured on `c8872aa`.",
        "It was 1.2 until 2026-11-26.",
        "at the commit 1234567",
        "with two matrix sessions sharing two cores",
        "The session ended.",
    ],
)
def test_log_phrases_are_found(text):
    assert offences("page.md", text)


@pytest.mark.parametrize(
    "text",
    [
        "A decade; 1e-12 in float16; `0.0596068` against `0.0596067`.",
        "12.6 MB, 1234567 rows, 2.5e-3, 0x10, 5.1e4 and 1024-1024-1024-10.",
        "Each nox session (`nox -s matrix`) and the `nox` sessions run alone.",
        "`tf.compat.v1.Session`, called before `1000000` steps, after 1234567.",
        "```bash\ngit checkout a4a51cc\n```",
        '--8<-- "bench/results/trace.md"',
        "<!-- matrix:start -->\n| a |\n\nRun 2026-11-23 to 2026-11-27.\n"
        "<!-- matrix:end -->",
    ],
)
def test_manual_prose_passes(text):
    assert offences("page.md", text) == []


def test_only_version_headings_of_the_changelog_carry_a_date():
    text = "## [0.2.0] - 2026-12-01\n\n- Fixed on 2026-11-30.\n"
    assert offences("changelog.md", text) == [(3, "date", "2026-11-30")]
    assert offences("index.md", text)[0][0] == 1


def test_benchmark_captions_keep_their_date_and_commit():
    text = (
        "Measured on the machine above, 2026-11-27, commit `11817c2`, 4 CPUs.\n"
        "These numbers were measured on\n2026-11-26, after `c84c0c7`.\n"
        "Measured on\nanother machine (Xeon(R) CPU, 2 cores), 2026-12-01, commit\n"
        "`cbfef52`:\n"
    )
    assert offences("benchmarks.md", text) == [(3, "commit hash", "c84c0c7")]


def test_a_hash_in_a_generated_table_still_fails():
    text = (
        "<!-- matrix:start -->\nRun 2026-11-27 on commit 75633ae.\n<!-- matrix:end -->"
    )
    assert [what for _, what, _ in offences("installation.md", text)] == ["commit hash"]


def test_pages_read_as_a_manual():
    pages = list(_pages())
    assert pages, f"no pages under {DOCS}"
    report = [
        f"docs/{page}:{line}: {what} {phrase!r}"
        for page in pages
        for line, what, phrase in offences(
            page.as_posix(), (DOCS / page).read_text(encoding="utf-8")
        )
    ]
    assert not report, (
        "these pages read as a development log; say it as a manual would "
        "(or move the history to the changelog's Unreleased section):\n"
        + "\n".join(report)
    )
