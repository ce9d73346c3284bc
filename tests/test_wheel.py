"""The wheel: built from the source tree, it holds every extension and names no path of the machine
that built it; installed into a fresh venv and run with no compiler on PATH, it computes the same
logits as the development install."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gguflm import Batch, Context, Model

pytestmark = pytest.mark.slow  # minutes: still part of the default run (CI runs it)

REPO = Path(__file__).resolve().parents[1]
PROMPT_IDS = [1, 504, 3458, 282, 4649, 314]

# what a build leaves in the tree, and what a wheel does not need
_NOT_SOURCE = {".git", ".venv", ".tox", "build", "dist", "tests", ".hypothesis", ".pytest_cache", "__pycache__"}


def _copy_sources(dst: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in _NOT_SOURCE or n.endswith((".so", ".egg-info"))}
        if Path(folder).name == "src":  # Cython's generated C, rebuilt from the .pyx
            skip |= {n for n in names if n.endswith(".c") and f"{n[:-2]}.pyx" in names}
        return skip

    shutil.copytree(REPO, dst, ignore=ignore)


def _elf_search_paths(blob: bytes) -> list[str]:
    """The DT_RPATH and DT_RUNPATH strings of a 64-bit little-endian ELF shared object."""
    assert blob[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", blob, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    paths = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, _entsize in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strtab_offset = sections[link][4]
        for pos in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", blob, pos)
            if tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                start = strtab_offset + value
                paths.append(blob[start:blob.index(b"\0", start)].decode())
    return paths


def _run(*cmd, **kwargs) -> str:
    """Run a command; on failure, fail with its output."""
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the source copy it was built from)."""
    root = tmp_path_factory.mktemp("wheel")
    source, out = root / "source", root / "dist"
    _copy_sources(source)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, source)
    wheels = list(out.glob("gguflm-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], source


def test_wheel_holds_every_extension_and_no_build_path(built_wheel, tmp_path):
    wheel, source = built_wheel
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        extensions = [n for n in names if n.startswith("gguflm/_ext/") and n.endswith(".so")]
        assert sorted(Path(n).name.split(".")[0] for n in extensions) == sorted(
            p.stem for p in (REPO / "src").glob("*.pyx"))
        assert "gguflm/py.typed" in names
        assert "gguflm/models/gemma3.py" in names and "gguflm/models/llama.py" in names
        assert not [n for n in names if n.startswith(("tests/", "src/"))]
        for name in extensions:
            blob = zf.read(name)
            assert str(source).encode() not in blob, f"{name} records the build directory"
            assert _elf_search_paths(blob) == [], f"{name} carries a library search path"


def test_wheel_runs_in_a_fresh_venv_without_a_compiler(built_wheel, smollm_path, tmp_path):
    wheel, _ = built_wheel
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel)
    # the runtime dependencies come from this environment, read as a plain folder (its .pth
    # files, among them the development install of gguflm, are not processed)
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    Path(site, "deps.pth").write_text(str(Path(np.__file__).parents[1]) + "\n")

    env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path), "CC": "/nonexistent/cc"}
    assert shutil.which("gcc", path=env["PATH"]) is None and shutil.which("cc", path=env["PATH"]) is None
    out = tmp_path / "logits.npy"
    script = (
        "import sys, numpy as np, gguflm\n"
        "assert gguflm.__file__.startswith(sys.prefix), gguflm.__file__\n"
        "assert gguflm.system_info()['openmp'], gguflm.system_info()\n"
        "ctx = gguflm.Context(gguflm.Model.load(sys.argv[1]), n_ctx=256, n_threads=2, n_threads_batch=2)\n"
        f"assert ctx.decode(gguflm.Batch.get_one({PROMPT_IDS})) == 0\n"
        "np.save(sys.argv[2], ctx.get_logits_ith(-1))\n"
    )
    _run(python, "-c", script, smollm_path, out, env=env, cwd=tmp_path)
    assert '"openmp": true' in _run(venv / "bin" / "gguflm", "info", env=env, cwd=tmp_path)

    ctx = Context(Model.load(smollm_path), n_ctx=256, n_threads=2, n_threads_batch=2)
    assert ctx.decode(Batch.get_one(PROMPT_IDS)) == 0
    np.testing.assert_array_equal(np.load(out), ctx.get_logits_ith(-1))
