"""README.md and docs/: every environment variable the project reads is documented in
docs/environment.md (and nothing else is), README.md stays short, and every relative link resolves."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ENVIRONMENT = DOCS / "environment.md"
README_MAX_LINES = 250

NAME = r"GGUFLM_[A-Z0-9_]*[A-Z0-9]"
# Python, Cython and C read a variable through a string literal, the name alone between quotes:
# os.environ.get("GGUFLM_..."), getenv("GGUFLM_..."), {"GGUFLM_...": ...}, monkeypatch.setenv(...).
# The C macros named GGUFLM_* are never quoted, and docstrings name variables in ``backquotes``.
QUOTED = re.compile(rf"""(?<![\w"'])(["'])({NAME})\1""")
# ... or as a keyword of the environment dict a subprocess gets: dict(os.environ, GGUFLM_...=value)
ENVIRON_CALL = re.compile(r"\benviron\s*,([^()]*)\)")
KEYWORD = re.compile(rf"\b({NAME})\s*=(?!=)")
# shell (.ci/run) and tox.ini read $GGUFLM_... and ${GGUFLM_...:-default}
DOLLAR = re.compile(rf"\$\{{?({NAME})\b")
# ... and a shell script sets one for what it runs: export GGUFLM_...=1, GGUFLM_...=1 command
SHELL_SET = re.compile(rf"(?:^|[\s;&|]|\bexport\s+)({NAME})=", re.M)
# a variable of docs/environment.md: a heading that is the name alone in backquotes
ENV_HEADING = re.compile(rf"^#{{2,6}} `({NAME})`\s*$", re.M)


def _sources() -> dict[str, list[Path]]:
    """The files that may read environment variables, by how they read them (not this one, whose
    examples would count)."""
    python = sorted((ROOT / "gguflm").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py")) + [ROOT / "setup.py"]
    python = [p for p in python if p.resolve() != Path(__file__).resolve()]
    cython_c = [p for pattern in ("*.pyx", "*.h", "*.inc") for p in sorted((ROOT / "src").glob(pattern))]
    shell = [ROOT / ".ci" / "run", ROOT / "tox.ini"]
    return {"code": python + cython_c, "shell": [p for p in shell if p.exists()]}


def names_read(text: str, kind: str, python: bool = False, tox: bool = False) -> set[str]:
    """The GGUFLM_* environment variables ``text`` reads or sets: ``kind`` "code" (Python,
    Cython, C; ``python`` adds the environ-dict keywords) or "shell" (``tox``: no assignments)."""
    names: set[str] = set()
    if kind == "code":
        names |= {m.group(2) for m in QUOTED.finditer(text)}
        if python:
            for call in ENVIRON_CALL.finditer(text):
                names |= set(KEYWORD.findall(call.group(1)))
    else:
        names |= set(DOLLAR.findall(text))
        if not tox:
            code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # not the comments
            names |= set(SHELL_SET.findall(code))
    return names


def variables_read() -> dict[str, set[str]]:
    """Every GGUFLM_* environment variable the code reads (or sets for what it runs), and where:
    ``{name: {relative paths}}``."""
    found: dict[str, set[str]] = {}
    for kind, paths in _sources().items():
        for path in paths:
            text = path.read_text(encoding="utf-8", errors="replace")
            for name in names_read(text, kind, python=path.suffix == ".py", tox=path.name == "tox.ini"):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def variables_documented() -> list[str]:
    return ENV_HEADING.findall(ENVIRONMENT.read_text(encoding="utf-8"))


def test_every_environment_variable_is_documented():
    read = variables_read()
    documented = variables_documented()
    missing = {name: sorted(where) for name, where in sorted(read.items()) if name not in documented}
    assert not missing, f"environment variables read but not in docs/environment.md: {missing}"


def test_environment_md_lists_each_variable_once_and_only_those_read():
    documented = variables_documented()
    twice = sorted({name for name in documented if documented.count(name) > 1})
    assert not twice, f"listed more than once in docs/environment.md: {twice}"
    text = ENVIRONMENT.read_text(encoding="utf-8")
    for name in documented:  # the heading is the one place the name stands alone in backquotes
        assert text.count(f"`{name}`") == 1, f"`{name}` appears in backquotes more than once"
    stale = sorted(set(documented) - set(variables_read()))
    assert not stale, f"docs/environment.md lists variables nothing reads: {stale}"


def test_variables_read_are_environment_variables():
    """The scan itself: it finds variables read in Python, Cython, setup.py and shell, and takes no
    C macro (a name some header #defines or tests with #if) for one."""
    read = variables_read()
    assert {"GGUFLM_MODELS", "GGUFLM_ISA", "GGUFLM_CPU", "GGUFLM_NO_OPENMP", "GGUFLM_REQUIRE_MODELS"} <= set(read)
    macros = set()
    for path in _sources()["code"]:
        if path.suffix in (".h", ".inc", ".pyx"):
            macros |= set(re.findall(rf"#\s*(?:define|ifdef|ifndef|if)\s+({NAME})", path.read_text(encoding="utf-8")))
    assert macros, "no C macro found: the check below would prove nothing"
    assert not (set(read) & macros), f"C macros taken for environment variables: {sorted(set(read) & macros)}"


def test_scan_patterns():
    python = "\n".join([
        'os.environ.get("GGUFLM_A", "")',
        "monkeypatch.setenv('GGUFLM_B', '1')",
        "env = dict(os.environ, GGUFLM_C=value, DISPLAY=display)",
        '"GGUFLM_D is not alone here"',                        # a message, not a variable
        "``GGUFLM_E=1`` in a docstring; GGUFLM_F == 2",
    ])
    assert names_read(python, "code", python=True) == {"GGUFLM_A", "GGUFLM_B", "GGUFLM_C"}
    c = "\n".join(["#define GGUFLM_SIMD_X 1", 'const char *p = getenv("GGUFLM_G");',
                     '#define GGUFLM_CAPSULE "gguflm._ext.system._dispatch"'])
    assert names_read(c, "code") == {"GGUFLM_G"}
    shell = "\n".join(['export GGUFLM_H="${GGUFLM_I:-$HOME}"', "GGUFLM_J=1 python -m pytest",
                        'mkdir -p "$GGUFLM_K"', "# GGUFLM_L=1 in a comment", "echo GGUFLM_M"])
    assert names_read(shell, "shell") == {"GGUFLM_H", "GGUFLM_I", "GGUFLM_J", "GGUFLM_K"}
    assert names_read("passenv = GGUFLM_*, HOME\nsetenv = X = ${GGUFLM_N}", "shell", tox=True) == {"GGUFLM_N"}


# -- README length and links


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES} (the rest goes in docs/)"


FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """Markdown without its code blocks and code spans (a link or heading there is not one)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the text without markup, lowercase, punctuation other than
    '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2, ... for repeated ones."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _documents() -> list[Path]:
    return [README] + sorted(DOCS.glob("*.md"))


def test_docs_exist():
    names = {p.name for p in DOCS.glob("*.md")}
    assert {"usage.md", "compat.md", "design.md", "kernels.md", "performance.md", "environment.md"} <= names


def test_relative_links_resolve():
    broken = []
    for doc in _documents():
        for target in LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto: not fetched
                continue
            path_part, _, fragment = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_is_githubs():
    assert slug("Every weight type against llama.cpp") == "every-weight-type-against-llamacpp"
    assert slug("Constrained generation (grammars, JSON schema, tool calls)") == \
        "constrained-generation-grammars-json-schema-tool-calls"
    assert slug("`GGUFLM_MODELS`") == "gguflm_models"
    assert slug("Kernel dispatch: ISA and arithmetic") == "kernel-dispatch-isa-and-arithmetic"
