"""README's list of architectures and weight types is the registry's (``python -m gguflm.readme
--write README.md`` regenerates it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gguflm.loader import SUPPORTED_TYPES
from gguflm.models import architectures
from gguflm.readme import README_BEGIN, README_END, readme_section

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_lists_the_registry():
    text = README.read_text(encoding="utf-8")
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    assert text[start:end] == readme_section(), "run: python -m gguflm.readme --write README.md"
    # every registered architecture and supported type is named there, nothing else
    listed = [line.split("`")[1] for line in text[start:end].splitlines() if line.startswith("| `")]
    assert listed[1:] == architectures()
    for t in SUPPORTED_TYPES:
        assert f" {t.name}," in text[start:end] or f" {t.name}." in text[start:end]


def test_write_replaces_only_the_list(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text(f"before\n{README_BEGIN}\nstale\n{README_END}\nafter\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "gguflm.readme", "--write", str(doc)], check=True)
    assert doc.read_text(encoding="utf-8") == f"before\n{readme_section()}\nafter\n"
