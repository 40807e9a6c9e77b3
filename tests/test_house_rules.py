"""The layout rules of DESIGN.md, checked: the algorithm core stays pure and cheap to import."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raytrain_seq"
ALGORITHM_MODULES = ["packing", "microbatch", "averaging", "refurbish"]


def _imported_roots(path: Path) -> set[str]:
    """Top-level names a module imports anywhere in its body (functions included)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                roots.add("." + (node.module or ""))
            else:
                roots.add(node.module.split(".")[0])
    return roots


def test_only_runtime_imports_ray():
    """No module outside raytrain_seq/runtime/ imports ray, even lazily inside a function."""
    offenders = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if "runtime" not in p.relative_to(PACKAGE).parts[:1] and "ray" in _imported_roots(p)
    ]
    assert offenders == []


def _project_imports(path: Path) -> set[str]:
    """Dotted names of the raytrain_seq modules a module imports ("raytrain_seq.binpack")."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "raytrain_seq")
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module.split(".")[0] == "raytrain_seq"
        ):
            names.add(node.module)
    return names


def _pure(roots: set[str]) -> set[str]:
    """The roots that are neither the standard library nor numpy/torch."""
    return {r for r in roots if r not in sys.stdlib_module_names} - {"numpy", "torch", "__future__"}


@pytest.mark.parametrize("name", ALGORITHM_MODULES)
def test_algorithm_modules_import_neither_ray_nor_each_other(name):
    """Each of the four algorithm modules imports only the standard library, numpy, torch and pure helper
    modules of the package that import only those themselves (packing -> binpack), never each other."""
    path = PACKAGE / f"{name}.py"
    assert path.exists(), f"{path} is part of the fixed layout"
    roots = _imported_roots(path)
    assert roots, f"{path} imports nothing at all: the parser found no imports"
    helpers = _project_imports(path)
    assert _pure(roots) <= ({"raytrain_seq"} if helpers else set()), _pure(roots)
    for helper in helpers:
        assert helper.split(".")[1] not in ALGORITHM_MODULES, f"{name} imports the algorithm module {helper}"
        helper_path = PACKAGE / f"{helper.split('.', 1)[1].replace('.', '/')}.py"
        assert helper_path.exists(), f"{name} imports {helper}, which is not a module file of the package"
        assert _pure(_imported_roots(helper_path)) == set(), f"{helper} (imported by {name}) is not pure"


def test_importing_the_core_starts_nothing():
    """Importing the package and its pure modules loads no ray and starts no thread pool."""
    code = (
        "import sys, threading, json\n"
        "import raytrain_seq, raytrain_seq.packing, raytrain_seq.refurbish\n"
        "import raytrain_seq.averaging, raytrain_seq.microbatch\n"
        "print(json.dumps({'ray': 'ray' in sys.modules, 'threads': threading.active_count()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"ray": False, "threads": 1}
