"""The built documentation site: links resolve, the reference is whole, code runs.

The site is built once, strictly, into a temporary folder (a few seconds);
the tests read the HTML that a browser would show.
"""

import html
import importlib
import inspect
import os
import posixpath
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import kerastower
import kerastower.callbacks
import kerastower.launch
import kerastower.testing

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = (
    "kerastower",
    "callbacks",
    "cluster",
    "evaluator",
    "multi_worker",
    "launch",
    "testing",
)
EXCEPTION = re.compile(r"\w*(Error|Exception|Exit|Warning|Interrupt)")


class _Page(HTMLParser):
    """The links, ids and Python code blocks of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links, self.ids, self.code_blocks = [], set(), []
        self._depth = 0  # inside a Python code block: the div's nesting depth
        self._code = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("href", "src"):
            if attrs.get(name):
                self.links.append(attrs[name])
        for name in ("id", "name"):
            if attrs.get(name):
                self.ids.add(attrs[name])
        classes = (attrs.get("class") or "").split()
        if self._code is not None and tag == "div":
            self._depth += 1
        elif (
            tag == "div"
            and "language-python" in classes
            and "doc-signature" not in classes
        ):
            self._code, self._depth = [], 1

    def handle_endtag(self, tag):
        if self._code is not None and tag == "div":
            self._depth -= 1
            if not self._depth:
                self.code_blocks.append("".join(self._code))
                self._code = None

    def handle_data(self, data):
        if self._code is not None:
            self._code.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # Not `-q`: it silences the warnings that `--strict` turns into a failure.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {}
    for path in sorted(out.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.relative_to(out).as_posix()] = page
    return out, pages


def _site_prefix():
    config = (ROOT / "mkdocs.yml").read_text()
    match = re.search(r"^site_url:\s*(\S+)", config, flags=re.M)
    return urlsplit(match.group(1)).path if match else "/"


def _target(page_name, link, prefix):
    """The site file and fragment a link points to, or None when external."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:")):
        return None
    path = unquote(parts.path)
    if not path:
        return page_name, parts.fragment
    if path.startswith("/"):
        assert path.startswith(prefix), f"{page_name}: {link} is outside {prefix}"
        path = path[len(prefix) :]
    else:
        path = posixpath.join(posixpath.dirname(page_name), path)
    path = posixpath.normpath(path)
    return ("index.html" if path == "." else path), parts.fragment


def test_links_resolve_as_a_browser_does():
    page = "guides/one-machine/index.html"
    assert _target(page, "../batch-scaling/#limits", "/k/") == (
        "guides/batch-scaling",
        "limits",
    )
    assert _target(page, "#the-model", "/k/") == (page, "the-model")
    assert _target(page, "/k/assets/x.css", "/k/") == ("assets/x.css", "")
    assert _target(page, "/k/", "/k/") == ("index.html", "")
    assert _target(page, "https://keras.io/api/", "/k/") is None


def test_every_internal_link_and_anchor_resolves(site):
    out, pages = site
    prefix = _site_prefix()
    broken = []
    for name, page in pages.items():
        for link in page.links:
            target = _target(name, link, prefix)
            if target is None:
                continue
            path, fragment = target
            if (out / path).is_dir():
                path = posixpath.join(path, "index.html")
            if not (out / path).is_file():
                broken.append(f"{name}: {link} (no {path})")
            elif fragment and path.endswith(".html"):
                if fragment not in pages[path].ids:
                    broken.append(f"{name}: {link} (no #{fragment} in {path})")
    assert not broken, "\n".join(broken)


def _documented_ids(pages):
    return set().union(*(pages[f"api/{p}/index.html"].ids for p in API_PAGES))


@pytest.mark.parametrize(
    "module",
    [kerastower, kerastower.callbacks, kerastower.launch, kerastower.testing],
    ids=lambda m: m.__name__,
)
def test_every_public_name_is_in_the_reference(site, module):
    _, pages = site
    ids = _documented_ids(pages)
    missing = []
    for name in module.__all__:
        value = getattr(module, name)
        names = {f"{module.__name__}.{name}"}
        if inspect.ismodule(value):
            names.add(value.__name__)
        elif getattr(value, "__module__", None):
            names.add(f"{value.__module__}.{name}")
        # Or where a public module hands it on: `kerastower.is_chief` is
        # documented as `kerastower.cluster.is_chief`.
        for page in API_PAGES[1:]:
            public = importlib.import_module(f"kerastower.{page}")
            if getattr(public, name, None) is value:
                names.add(f"kerastower.{page}.{name}")
        if not names & ids:
            missing.append(name)
    assert not missing, f"not in the API reference: {missing}"


def test_every_public_module_has_a_page(site):
    _, pages = site
    for name in API_PAGES:
        assert f"api/{name}/index.html" in pages
    for module in ("cluster", "multi_worker"):
        page = pages[f"api/{module}/index.html"]
        functions = [
            n
            for n, f in inspect.getmembers(
                importlib.import_module(f"kerastower.{module}")
            )
            if inspect.isfunction(f) and not n.startswith("_") and f.__doc__
        ]
        for function in functions:
            assert f"kerastower.{module}.{function}" in page.ids, function


def _documented_parameters(obj):
    names = set()
    docstrings = [obj.docstring]
    if obj.is_class and "__init__" in obj.members:
        docstrings.append(obj.members["__init__"].docstring)
    for docstring in filter(None, docstrings):
        for section in docstring.parse("google"):
            if section.kind.value == "parameters":
                names |= {p.name.lstrip("*") for p in section.value}
    return names


def test_every_parameter_in_the_reference_is_documented(site):
    griffe = pytest.importorskip("griffe")
    _, pages = site
    package = griffe.load("kerastower", search_paths=[str(ROOT)])
    undocumented, checked = [], 0
    for anchor in sorted(_documented_ids(pages)):
        if not anchor.startswith("kerastower."):
            continue
        try:
            obj = package[anchor.removeprefix("kerastower.")]
        except KeyError:
            continue
        obj = obj.final_target if obj.is_alias else obj
        if obj.is_class:
            init = obj.members.get("__init__")
            # `__init__ = Exception.__init__` is an attribute: no parameters.
            parameters = getattr(init, "parameters", [])
        elif obj.is_function:
            parameters = obj.parameters
        else:
            continue
        checked += 1
        names = [p.name for p in parameters if p.name not in ("self", "cls")]
        missing = [n for n in names if n not in _documented_parameters(obj)]
        if missing and "property" not in obj.labels:
            undocumented.append(f"{anchor}: {missing}")
    assert checked > 25
    assert not undocumented, "parameters without an Args entry:\n" + "\n".join(
        undocumented
    )


def _section_rows(text, title):
    """The first cell of every row of every `title` table of an API page."""
    rows = []
    pattern = rf'doc-section-title">{title}:</span></p>\s*<table>(.*?)</table>'
    for table in re.findall(pattern, text, flags=re.S):
        body = table.split("<tbody>", 1)[1]
        cells = re.findall(
            r'<tr class="doc-section-item">\s*<td>(.*?)</td>', body, re.S
        )
        rows.append([html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells])
    return rows


@pytest.mark.parametrize("name", API_PAGES)
def test_reference_tables_have_one_row_per_item_and_no_quotes(site, name):
    out, _ = site
    text = (out / "api" / name / "index.html").read_text(encoding="utf-8")
    # A wrapped Returns line at the section's indentation renders as a second
    # row; a wrapped line that starts with ">" renders as a block quote.
    for rows in _section_rows(text, "Returns"):
        assert len(rows) == 1, rows
        # A colon in the first line of the description splits it into a type.
        assert not re.search(r"[A-Za-z]+ [A-Za-z]+", rows[0]), rows
    for rows in _section_rows(text, "Raises"):
        assert all(EXCEPTION.fullmatch(r) for r in rows), rows
    assert "<blockquote>" not in text


def _as_script(block):
    """A code block as the script a reader pastes (doctest prompts removed)."""
    lines = block.splitlines()
    if not any(line.startswith(">>> ") for line in lines):
        return block
    return "\n".join(line[4:] for line in lines if line.startswith((">>> ", "... ")))


def test_every_python_block_defines_the_names_it_uses(site, tmp_path):
    # Every block must run when pasted into a file: no name that some hidden
    # scaffolding or an earlier block would define. (The examples that the
    # guides include are run by tests/test_examples.py.)
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    _, pages = site
    files = {}
    for name, page in pages.items():
        for i, block in enumerate(page.code_blocks):
            path = tmp_path / f"{name.replace('/', '__')}__{i}.py"
            path.write_text(_as_script(block))
            files[path.name] = (name, block)
    assert len(files) > 20
    result = subprocess.run(
        [ruff, "check", "--isolated", "--no-cache", "--select", "F821,F822,F823"]
        + ["--output-format", "concise", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_readme_and_home_list_every_guide():
    readme = (ROOT / "README.md").read_text()
    home = (ROOT / "docs" / "index.md").read_text()
    for guide in sorted((ROOT / "docs" / "guides").glob("*.md")):
        assert f"(docs/guides/{guide.name})" in readme, guide.name
        assert f"(guides/{guide.name})" in home, guide.name
