"""The layout of src/ that src/README.md describes: every header (.h) has an include guard and
compiles on its own, including what it uses; every per-ISA fragment (.inc) has no guard and is
compiled by a header; setup.py and MANIFEST.in take both kinds."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
HEADERS = sorted(SRC.glob("*.h"))
FRAGMENTS = sorted(SRC.glob("*.inc"))
GUARD = re.compile(r"^#ifndef (GGUFLM_\w+_H)\n#define \1\n", re.M)


def _directives(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")]


@pytest.mark.parametrize("header", HEADERS, ids=lambda p: p.name)
def test_header_has_an_include_guard(header):
    directives = _directives(header)
    match = GUARD.search(header.read_text(encoding="utf-8"))
    assert match and directives[0] == f"#ifndef {match.group(1)}", f"{header.name}: no include guard first"
    assert directives[-1] == "#endif", f"{header.name}: the guard does not close the file"


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.name)
def test_fragment_has_no_guard_and_an_includer(fragment):
    assert not GUARD.search(fragment.read_text(encoding="utf-8")), f"{fragment.name}: a fragment with a guard"
    includers = [p.name for p in HEADERS + FRAGMENTS if f'#include "{fragment.name}"' in p.read_text(encoding="utf-8")]
    assert includers, f"{fragment.name} is included by nothing"


def test_every_header_compiles_on_its_own(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to compile the headers")
    units = []
    for header in HEADERS:
        unit = tmp_path / f"{header.stem}.c"
        unit.write_text(f'#include "{header.name}"\n')
        units.append(str(unit))
    done = subprocess.run([cc, "-fsyntax-only", "-fopenmp", "-Wall", "-Wno-unused-function", "-Wno-unknown-pragmas",
                           "-Werror", f"-I{SRC}", *units], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


def test_setup_and_manifest_take_headers_and_fragments():
    assert '"*.inc"' in (ROOT / "setup.py").read_text(encoding="utf-8")
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8")
    assert re.search(r"recursive-include src .*\*\.h\b.*\*\.inc\b", manifest)
