"""Ray stays optional: ``import gguflm`` (and its CLI and server) imports no Ray, and outside
gguflm/ray/ Ray is imported only inside functions (``gguflm serve --ray``, the batch bench)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gguflm"


def test_importing_gguflm_imports_no_ray():
    code = ("import sys, gguflm, gguflm.cli, gguflm.llm\n"
            "try:\n    import gguflm.server\nexcept ImportError:\n    pass\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=PACKAGE.parent)
    assert out.stdout.strip() == "[]"


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run on import: the module's, and those of its top-level if/try blocks."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]
    return out


def test_ray_is_imported_at_module_level_only_in_gguflm_ray():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "ray" and path.parent.parent == PACKAGE:
            continue
        for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "ray" or n.startswith(("ray.", "gguflm.ray")) for n in names):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert offenders == []
