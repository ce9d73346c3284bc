"""llama-cpp-python's own test suite (tests/llama_cpp_python, its 0.3.36 files unchanged) against
``gguflm.llama_cpp``: every test that passes on llama-cpp-python with the same local model files
passes on gguflm. ``test_real_model`` (llama.cpp's C API, out of gguflm's scope) is the one
exclusion. Both runs are child pytest processes (the suite's ``import llama_cpp`` names the backend
there); their outcomes come from JUnit XML.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from _llama import require_peer

HERE = Path(__file__).resolve().parent
SUITE = HERE / "llama_cpp_python"
EXCLUDED = {"test_llama.py::test_real_model"}
VOCAB = "ggml-vocab-llama-spm.gguf"

pytestmark = pytest.mark.slow  # minutes: still part of the default run (CI runs it)


def _outcomes(backend: str, workdir: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped, for the suite run with ``backend``."""
    report = workdir / f"{backend}.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(SUITE),
                          "-c", os.devnull, "--confcutdir", str(SUITE), f"--backend={backend}",
                          f"--junitxml={report}", str(SUITE)],
                         cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)
    assert report.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{Path(case.get('file') or case.get('classname').replace('.', '/') + '.py').name}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
    return outcomes


def test_what_passes_on_llama_cpp_python_passes_on_gguflm(tmp_path):
    require_peer()
    models = tmp_path / "vendor" / "llama.cpp" / "models"   # the suite's relative vocabulary path
    models.mkdir(parents=True)
    (models / VOCAB).symlink_to(HERE / "data" / "vocab" / VOCAB)
    theirs, ours = _outcomes("llama_cpp", tmp_path), _outcomes("gguflm", tmp_path)
    assert theirs, "the suite collected no tests"
    required = {t for t, outcome in theirs.items() if outcome == "passed"} - EXCLUDED
    missing = sorted(t for t in required if ours.get(t) != "passed")
    print(f"\nllama-cpp-python's suite: {len(required)} pass on llama-cpp-python; gguflm passes "
          f"{len(required) - len(missing)} of them and {sum(o == 'passed' for o in ours.values())} in all "
          f"(of {len(theirs)} collected)")
    assert not missing, f"pass on llama-cpp-python, not on gguflm: {missing}"
