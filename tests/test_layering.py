"""The package's layers import downward only: targets -> data -> drafter/train -> kernels -> spec ->
experiments (README "Development"). A name both sides need lives in the lower one."""

from __future__ import annotations

import ast
from pathlib import Path

import drafter_lab

LAYER = {"targets": 0, "data": 1, "drafter": 2, "train": 2, "kernels": 3, "spec": 4, "experiments": 5}
PACKAGE = Path(drafter_lab.__file__).parent


def _imports(path: Path):
    """(line, drafter_lab subpackage) of every import in `path`, function-level ones included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        parts = [name.split(".") for name in names]
        for sub in sorted({p[1] for p in parts if p[0] == "drafter_lab" and len(p) > 1 and p[1] in LAYER}):
            yield node.lineno, sub


def test_no_layer_imports_a_higher_one():
    upward = [f"{path.relative_to(PACKAGE.parent)}:{line} imports drafter_lab.{other}"
              for path in sorted(PACKAGE.rglob("*.py")) if path.parent.name in LAYER
              for line, other in _imports(path) if LAYER[other] > LAYER[path.parent.name]]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The scan reads imports inside functions too (most of the lab's are lazy)."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from drafter_lab.spec.pairing import check_config\n")
    assert list(_imports(path)) == [(2, "spec")]
