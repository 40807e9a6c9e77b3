"""The house rules of the layout (docs/ARCHITECTURE.md), checked on the source with the AST.

Rules pinned, each by a checker function and a test of the real tree:

1. only modules under raytrain_seq/runtime/ import ray (imports inside functions count);
2. no folder of the package is one that ruff skips by default (``dist``, ``build``, ``.venv``, ...), and
   ``ruff check --show-files .`` lists every .py file of the package;
3. the modules of raytrain_seq import each other without a cycle;
4. no module of raytrain_seq/, jobs/ or bench/ uses another module's private name, a library's
   included (tests may);
5. the algorithm modules (the four papers', AAVG's as ``averaging`` and ``batchsize``) are pure and import
   neither ray nor each other; importing the core starts nothing;
6. the Ray-free packages (rounds/, dataplane/, rows/, members/, feed/) import neither ray nor raytrain_seq.runtime;
7. no file of the project cites a path outside the repository (the seed design document, ``../`` out);
8. tests start Ray only through tests/conftest.py's ``ray_cluster`` (or a cluster they name);
9. no function of raytrain_seq/ or bench/ is over 80 lines (the listed exceptions may not grow);
10. the code of raytrain_seq/ and jobs/ holds no date and no measured figure (it cites docs/ instead).
11. no two folders of raytrain_seq import each other: the folders are layers, each import between two of
    them points one way (imports inside functions count);
12. no class of raytrain_seq/ has over 20 methods and no module over 600 lines (the listed exceptions may
    not grow, and leave the list once within the bar);
13. no module docstring of raytrain_seq/, jobs/ or bench/ is over 15 lines;
14. every section of docs/ARCHITECTURE.md that a file cites by name is a heading there;
15. raytrain_seq/ holds at most 8 modules beside its folders, each folder's ``__init__`` says in one
    paragraph what it holds;
16. no parameter or return annotation between runtime/ and the learners (every function of
    runtime/learner.py; the public methods of the averager, the feed and the learners' proxies of them)
    holds a ``dict[str, Any]`` or a bare ``dict``.

Each checker also gets a synthetic counterexample (``test_checker_*``), so that no rule passes vacuously.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raytrain_seq"
ALGORITHM_MODULES = [
    "algorithms.packing",
    "algorithms.microbatch",
    "algorithms.averaging",
    "algorithms.batchsize",
    "algorithms.refurbish",
]
# Folder names ruff skips by default (`exclude`, https://docs.astral.sh/ruff/settings/#exclude: the list
# of ruff 0.6 and that of the ruff pinned here, `ruff check --show-settings`), and `build`, which older ruff
# skipped and setuptools writes: no folder of the package may carry one of these names.
RUFF_DEFAULT_EXCLUDES = frozenset(
    {
        ".bzr",
        ".direnv",
        ".eggs",
        ".git",
        ".git-rewrite",
        ".hg",
        ".ipynb_checkpoints",
        ".mypy_cache",
        ".nox",
        ".pants.d",
        ".pyenv",
        ".pytest_cache",
        ".pytype",
        ".ruff_cache",
        ".svn",
        ".tox",
        ".venv",
        ".vscode",
        "__pypackages__",
        "_build",
        "buck-out",
        "build",
        "dist",
        "node_modules",
        "site-packages",
        "venv",
    }
)
# The files rule 7 reads, and what counts as citing a path outside the repository. The patterns are
# regexes, so this file does not match them itself.
CITING_SUFFIXES = (".py", ".md", ".sh", ".yaml", ".toml")
OUTSIDE_PATTERNS = {
    r"\bDESIGN\.md\b": "the seed design document, outside the repository (docs/ARCHITECTURE.md replaces it)",
    r"\.\./shared\b": "the seed's shared folder, outside the repository",
}
RELATIVE_PATH = re.compile(r"(?<![\w./~-])((?:\.\./)+[\w.\-/]*)")


# ------------------------------------------------------------------------------------------ helpers
def _module_name(path: Path, base: Path) -> str:
    """Dotted name of a module file below ``base`` (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file for every .py file of ``package`` (its parent is the import root)."""
    return {
        _module_name(p, package.parent): p
        for p in sorted(package.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _is_package_file(path: Path) -> bool:
    return path.name == "__init__.py"


def _raw_imports(path: Path, own: str) -> Iterator[tuple[int, str, str | None, str | None]]:
    """(line, module, name, bound-as) of every import in the file, inside functions too.

    ``import a.b as c`` gives (n, "a.b", None, "c"); ``from a import b as c`` gives (n, "a", "b", "c").
    A relative import is resolved against ``own``, the file's dotted module name.
    """
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None, alias.asname
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = own.split(".") if _is_package_file(path) else own.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                module = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, module, alias.name, alias.asname


def _imported_roots(path: Path, own: str = "") -> set[str]:
    """Top-level names of the modules a file imports anywhere in its body (functions included)."""
    return {module.split(".")[0] for _, module, _, _ in _raw_imports(path, own or path.stem) if module}


def _longest_module(dotted: str, modules: Iterable[str]) -> str | None:
    """The longest prefix of ``dotted`` that is one of ``modules`` (``a.b.c`` -> ``a.b`` if only that is)."""
    known = set(modules)
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def _imported_modules(path: Path, own: str, modules: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) for each import of one of ``modules``: ``from a import b`` is module a.b when that is
    a module file, else a; ``import a.b.c`` is the longest of a.b.c, a.b, a that is a module file."""
    for line, module, name, _ in _raw_imports(path, own):
        target = None
        if name is not None and f"{module}.{name}" in modules:
            target = f"{module}.{name}"
        elif module:
            target = _longest_module(module, modules)
        if target is not None:
            yield line, target


def _git_files(root: Path, *pathspecs: str) -> list[Path] | None:
    """Files git tracks or would track (untracked, not ignored) under ``root``; None without git."""
    if shutil.which("git") is None:
        return None
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *pathspecs],
        capture_output=True,
        text=True,
        cwd=root,
    )
    if out.returncode != 0:
        return None
    # A file deleted in the working tree but still in the index is no longer part of the project.
    return [root / name for name in out.stdout.split("\0") if name and (root / name).is_file()]


# --------------------------------------------------------------------------- rule 1 and 6: ray imports
def ray_importers(package: Path) -> list[str]:
    """Files of ``package`` outside its runtime/ folder that import ray, even lazily."""
    return sorted(
        str(p.relative_to(package.parent))
        for own, p in _package_modules(package).items()
        if p.relative_to(package).parts[0] != "runtime" and "ray" in _imported_roots(p, own)
    )


# The Ray-free packages of the elastic logic, one concept each (docs/ARCHITECTURE.md, "Layout").
RAY_FREE_PACKAGES = (
    "rounds",
    "dataplane",
    "rows",
    "members",
    "feed",
    "algorithms",
    "training",
    "outputs",
    "inference",
)


def ray_free_violations(package: Path) -> list[str]:
    """Imports of ray or of ``<package>.runtime`` by the modules of the Ray-free packages."""
    runtime = f"{package.name}.runtime"
    owned = tuple(f"{package.name}.{name}" for name in RAY_FREE_PACKAGES)
    found = []
    for own, path in _package_modules(package).items():
        if not any(own == pkg or own.startswith(pkg + ".") for pkg in owned):
            continue
        for line, module, name, _ in _raw_imports(path, own):
            full = f"{module}.{name}" if name else module
            if module.split(".")[0] == "ray" or any(
                m == runtime or m.startswith(runtime + ".") for m in (module, full)
            ):
                found.append(f"{path.relative_to(package.parent)}:{line} imports {full}")
    return sorted(found)


def test_only_runtime_imports_ray():
    """No module outside raytrain_seq/runtime/ imports ray, even lazily inside a function."""
    assert (PACKAGE / "runtime").is_dir(), "raytrain_seq/runtime/ is part of the layout"
    assert ray_importers(PACKAGE) == []


def test_ray_free_packages_import_neither_ray_nor_runtime():
    """rounds/, dataplane/, rows/, members/ and feed/ are Ray-free: they import neither ray nor
    raytrain_seq.runtime, even lazily."""
    for name in RAY_FREE_PACKAGES:
        assert (PACKAGE / name / "__init__.py").is_file(), f"raytrain_seq/{name}/ is part of the layout"
    assert ray_free_violations(PACKAGE) == []


def test_checker_finds_ray_outside_runtime_and_runtime_in_a_ray_free_package(tmp_path):
    """The checkers catch a lazy ``import ray`` in the core and a Ray-free package importing runtime."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core.py": "def f():\n    import ray.util\n",
            "pkg/runtime/__init__.py": "",
            "pkg/runtime/actor.py": "import ray\n",
            "pkg/dataplane/__init__.py": "from pkg import runtime\n",
            "pkg/rounds/book.py": "def f():\n    from ..runtime.actor import g\n    import ray\n",
            "pkg/roundsx.py": "import ray\n",
        },
    )
    assert ray_importers(pkg) == ["pkg/core.py", "pkg/rounds/book.py", "pkg/roundsx.py"]
    assert ray_free_violations(pkg) == [
        "pkg/dataplane/__init__.py:1 imports pkg.runtime",
        "pkg/rounds/book.py:2 imports pkg.runtime.actor.g",
        "pkg/rounds/book.py:3 imports ray",
    ]


# ------------------------------------------------------------------------- rule 2: what ruff sees
def excluded_folders(package: Path) -> list[str]:
    """Folders below ``package`` holding .py files whose name ruff excludes by default."""
    return sorted(
        str(d.relative_to(package.parent))
        for d in package.rglob("*")
        if d.is_dir() and d.name in RUFF_DEFAULT_EXCLUDES and any(d.rglob("*.py"))
    )


def ruff_listed(root: Path) -> set[Path]:
    """The files ``ruff check --show-files .`` lists when run from ``root`` (the venv's ruff)."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert out.returncode == 0, f"ruff check --show-files failed in {root}:\n{out.stderr}"
    return {(root / line.strip()).resolve() for line in out.stdout.splitlines() if line.strip()}


def unlinted(files: Iterable[Path], listed: set[Path], root: Path) -> list[str]:
    """The ``files`` that ruff does not list, relative to ``root``."""
    return sorted(str(f.relative_to(root)) for f in files if f.resolve() not in listed)


def test_no_package_folder_is_one_ruff_skips():
    """No folder of raytrain_seq that holds code is named dist, build or another of ruff's default excludes."""
    assert excluded_folders(PACKAGE) == []


def test_ruff_lints_every_module_of_the_package():
    """``ruff check --show-files .`` from the repository root lists every .py file of raytrain_seq/ that git
    tracks (or would track: new, not ignored), so `make lint` checks all the package's code."""
    files = _git_files(ROOT, "raytrain_seq/*.py")
    if files is None:
        pytest.skip("git is not available or this is no git checkout: the package's file list is unknown")
    assert len(files) >= len(ALGORITHM_MODULES), f"git lists only {files}: not the package"
    assert unlinted(files, ruff_listed(ROOT), ROOT) == []


def test_checker_finds_a_dist_folder_that_ruff_skips(tmp_path):
    """A package with a dist/ and a build/ folder: both named; ruff really leaves dist/'s modules out, so
    the --show-files comparison names them."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/ok.py": "X = 1\n",
            "pkg/dist/__init__.py": "",
            "pkg/dist/mod.py": "X = 1\n",
            "pkg/build/deep/mod.py": "X = 1\n",
            "pkg/node_modules/README.md": "no code here\n",
        },
    )
    assert excluded_folders(pkg) == ["pkg/build", "pkg/dist"]
    files = sorted(pkg.rglob("*.py"))
    assert unlinted(files, ruff_listed(tmp_path), tmp_path) == ["pkg/dist/__init__.py", "pkg/dist/mod.py"]


# ------------------------------------------------------------------------------ rule 3: import cycles
def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: first line}, imports anywhere in the file counted."""
    modules = _package_modules(package)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for own, path in modules.items():
        for line, target in _imported_modules(path, own, modules):
            if target != own:
                graph[own].setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        paths = {start: [start]}  # breadth first: the shortest cycle through the group's first module
        frontier = [start]
        cycle = None
        while cycle is None:
            step = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start and cycle is None:
                        cycle = [*paths[v], start]
                    elif w in members and w not in paths:
                        paths[w] = [*paths[v], w]
                        step.append(w)
            frontier = step
        cycles.append(cycle)
    return cycles


def _describe_cycle(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    links = ", ".join(f"{a} line {graph[a][b]} imports {b}" for a, b in itertools.pairwise(cycle))
    return f"{' -> '.join(cycle)} ({links})"


def test_no_import_cycle_in_the_package():
    """The modules of raytrain_seq import each other without a cycle (imports inside functions count)."""
    graph = import_graph(PACKAGE)
    assert sum(map(len, graph.values())) > len(ALGORITHM_MODULES), "the graph has almost no edges"
    cycles = [_describe_cycle(c, graph) for c in import_cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_checker_finds_an_import_cycle(tmp_path):
    """A lazy import closing a 3-module loop is found and printed; an acyclic package gives no cycle."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from pkg.b import B\nA = 1\n",
            "pkg/b.py": "import pkg.sub.c\nB = 1\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "def f():\n    from pkg import a\n",
            "pkg/sub/d.py": "from . import c\nfrom .c import f\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a": 1} and graph["pkg.sub.d"] == {"pkg.sub.c": 1}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert _describe_cycle(import_cycles(graph)[0], graph).startswith("pkg.a -> pkg.b -> pkg.sub.c -> pkg.a")
    (pkg / "sub" / "c.py").write_text("def f():\n    return 1\n")
    assert import_cycles(import_graph(pkg)) == []


# ------------------------------------------------------------------ rule 11: folders import one way
def folder_links(package: Path) -> dict[tuple[str, str], str]:
    """(importing folder, imported folder) -> its first import, for the top-level folders of ``package``.

    A folder is a subpackage directly below ``package``; a folder nested deeper counts as part of its
    top-level one, a module directly in ``package`` as no folder. Imports anywhere in a file count.
    """
    modules = _package_modules(package)
    folder = {
        own: path.relative_to(package).parts[0]
        for own, path in modules.items()
        if len(path.relative_to(package).parts) > 1
    }
    links: dict[tuple[str, str], str] = {}
    for own, targets in sorted(import_graph(package).items()):
        for target, line in sorted(targets.items()):
            pair = (folder.get(own), folder.get(target))
            if None not in pair and pair[0] != pair[1]:
                links.setdefault(pair, f"{own} line {line} imports {target}")
    return links


def two_way_folders(package: Path) -> list[str]:
    """Each pair of folders of ``package`` that import each other, with the first import of each way."""
    links = folder_links(package)
    return [
        f"{a}/ <-> {b}/: {links[a, b]}; {links[b, a]}" for a, b in sorted(links) if a < b and (b, a) in links
    ]


def test_no_two_folders_of_the_package_import_each_other():
    """The folders of raytrain_seq are layers: between two of them imports point one way only (members/
    below rounds/ and dataplane/, dataplane/ below rounds/, runtime/ above all), imports inside functions
    counted. A name both sides need moves down into a folder below both."""
    links = folder_links(PACKAGE)
    assert ("rounds", "dataplane") in links and ("dataplane", "members") in links, "no folder imports seen"
    assert two_way_folders(PACKAGE) == []


def test_checker_finds_two_folders_that_import_each_other(tmp_path):
    """A lazy import back up and a nested folder's import are each caught; a one-way link, a top-level
    module both folders import and imports inside one folder are not."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core.py": "from pkg.a.x import X\n",
            "pkg/a/__init__.py": "",
            "pkg/a/x.py": "from pkg import core\nfrom pkg.b.y import Y\nfrom . import z\nX = 1\n",
            "pkg/a/z.py": "def f():\n    from pkg.b import y\n",
            "pkg/b/__init__.py": "",
            "pkg/b/y.py": "import pkg.core\nY = 1\ndef f():\n    from pkg.a.x import X\n",
            "pkg/c/__init__.py": "from pkg.a import x\n",
            "pkg/c/deep/__init__.py": "",
            "pkg/c/deep/w.py": "from pkg.d import v\n",
            "pkg/d/__init__.py": "",
            "pkg/d/v.py": "from pkg.c import deep\n",
        },
    )
    assert two_way_folders(pkg) == [
        "a/ <-> b/: pkg.a.x line 2 imports pkg.b.y; pkg.b.y line 4 imports pkg.a.x",
        "c/ <-> d/: pkg.c.deep.w line 1 imports pkg.d.v; pkg.d.v line 1 imports pkg.c.deep",
    ]
    (pkg / "b" / "y.py").write_text("import pkg.core\nY = 1\n")
    (pkg / "d" / "v.py").write_text("V = 1\n")
    assert two_way_folders(pkg) == []
    assert set(folder_links(pkg)) == {("a", "b"), ("c", "a"), ("c", "d")}


# ------------------------------------------------------------------------------ rule 4: private names
def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _private_owner(importer: str, full: str, modules: dict[str, Path]) -> str | None:
    """The module whose private name ``full`` (``pkg.mod._x`` or ``pkg._mod``) is, if ``importer`` may
    not use it: a private name belongs to its module only, a private module to its package."""
    parts = full.split(".")
    for i in range(1, len(parts)):
        if not _is_private(parts[i]):
            continue
        owner = ".".join(parts[:i])
        if owner not in modules:
            return None  # not one of the project's modules
        if ".".join(parts[: i + 1]) in modules:  # a private module: its package's own business
            if importer == owner or importer.startswith(owner + "."):
                continue
            return owner
        return None if importer == owner else owner
    return None


def _private_attributes(path: Path, bound: dict[str, str]) -> Iterator[tuple[int, str]]:
    """(line, full dotted name) of every private attribute reached through a name an import bound:
    ``import pkg.a as m; m._x`` gives (2, "pkg.a._x") when ``bound`` maps "m" to "pkg.a"."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        dotted = _dotted(node)
        if dotted is None or dotted.split(".")[0] not in bound:
            continue
        head, _, rest = dotted.partition(".")
        yield node.lineno, f"{bound[head]}.{rest}"


def private_uses(files: Iterable[Path], package: Path) -> list[str]:
    """Uses of another module's private name: ``from pkg.a import _x``, ``import pkg._a``, ``a._x``.

    The modules are those of ``package`` and, for a script in a folder that is no package (bench/,
    jobs/), the scripts beside it (``from benchlib import _x``).
    """
    package_modules = _package_modules(package)
    found = []
    for path in files:
        own_base = package.parent
        modules = dict(package_modules)
        if not (path.parent / "__init__.py").exists():  # a script: its folder is on sys.path
            modules.update({p.stem: p for p in path.parent.glob("*.py")})
            own_base = path.parent
        try:
            own = _module_name(path, own_base)
        except ValueError:
            own = path.stem
        bound: dict[str, str] = {}
        for line, module, name, asname in _raw_imports(path, own):
            full = f"{module}.{name}" if name else module
            if name is None and asname is None:
                bound[module.split(".")[0]] = module.split(".")[0]
            else:
                bound[asname or name or module] = full
            owner = _private_owner(own, full, modules)
            if owner is not None:
                found.append(f"{_rel(path)}:{line} imports {full}, private to {_rel(modules[owner])}")
        for lineno, full in _private_attributes(path, bound):
            if full.rsplit(".", 1)[0] not in modules:
                continue  # an attribute of an object, not of a module
            owner = _private_owner(own, full, modules)
            if owner is not None:
                found.append(f"{_rel(path)}:{lineno} uses {full}, private to {_rel(modules[owner])}")
    return sorted(set(found))


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _project_code() -> list[Path]:
    return sorted(p for top in ("raytrain_seq", "jobs", "bench") for p in (ROOT / top).rglob("*.py"))


def test_no_module_uses_another_modules_private_name():
    """No file of raytrain_seq/, jobs/ or bench/ imports (or reaches through an imported module) a name
    that starts with ``_`` from another module: a shared helper gets a public name. Tests may."""
    files = _project_code()
    assert any(f.parent.name == "bench" for f in files) and any(f.parent.name == "jobs" for f in files)
    assert private_uses(files, PACKAGE) == []


def test_checker_finds_private_names_used_across_modules(tmp_path):
    """``from a import _x``, ``import m; m._x``, a private module from outside its package and a script's
    ``from helper import _x`` are named with both files; dunders, own names and sibling modules are fine."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "__version__ = '1'\n",
            "pkg/a.py": "from pkg.a import _x\n_x = 1\n",
            "pkg/b.py": "from pkg.a import _x, y\nfrom pkg import __version__\n",
            "pkg/c.py": "def f():\n    import pkg.a as m\n    return m._x + m.y._z\n",
            "pkg/d.py": "import pkg.a\nv = pkg.a._x\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/_impl.py": "",
            "pkg/sub/e.py": "from pkg.sub import _impl\n",
            "pkg/f.py": "from pkg.sub import _impl\nfrom .a import _x as x\n",
            "bench/helper.py": "def _h():\n    pass\n",
            "bench/run.py": "import helper\nfrom helper import _h\nhelper._h()\n",
        },
    )
    files = sorted(tmp_path.rglob("*.py"))
    assert private_uses(files, pkg) == sorted(
        [
            f"{tmp_path}/bench/run.py:2 imports helper._h, private to {tmp_path}/bench/helper.py",
            f"{tmp_path}/bench/run.py:3 uses helper._h, private to {tmp_path}/bench/helper.py",
            f"{tmp_path}/pkg/b.py:1 imports pkg.a._x, private to {tmp_path}/pkg/a.py",
            f"{tmp_path}/pkg/c.py:3 uses pkg.a._x, private to {tmp_path}/pkg/a.py",
            f"{tmp_path}/pkg/d.py:2 uses pkg.a._x, private to {tmp_path}/pkg/a.py",
            f"{tmp_path}/pkg/f.py:1 imports pkg.sub._impl, private to {tmp_path}/pkg/sub/__init__.py",
            f"{tmp_path}/pkg/f.py:2 imports pkg.a._x, private to {tmp_path}/pkg/a.py",
        ]
    )


def library_private_uses(files: Iterable[Path], package: Path) -> list[str]:
    """Uses of a library's private name (Ray's, torch's, the standard library's: any module that is not
    the project's): ``from ray._private.state import actors``, ``from torch.nn.modules.batchnorm import
    _BatchNorm``, ``import torch.cuda as c; c._sleep(1)``. A library's private names change without notice
    between its releases; its public API is what a pinned version promises. Dunders are public, and so is a
    private top-level module (``_thread``): only names behind a public root count."""
    project = {package.name}
    found = []
    for path in files:
        local = (
            {p.stem for p in path.parent.glob("*.py")}
            if not (path.parent / "__init__.py").exists()
            else set()
        )
        try:
            own = _module_name(path, package.parent)
        except ValueError:
            own = path.stem
        bound: dict[str, str] = {}
        for line, module, name, asname in _raw_imports(path, own):
            root = module.split(".")[0]
            if not module or root in project or root in local:
                continue
            full = f"{module}.{name}" if name else module
            bound[asname or name or root] = full if (asname or name) else root
            if any(_is_private(part) for part in full.split(".")[1:]):
                found.append(f"{_rel(path)}:{line} imports {full}")
        found += [f"{_rel(path)}:{lineno} uses {full}" for lineno, full in _private_attributes(path, bound)]
    return sorted(set(found))


def test_no_module_uses_a_librarys_private_name():
    """No file of raytrain_seq/, jobs/ or bench/ imports or reaches a private name of Ray, torch or any
    other library (tests may, where a library has no public form of what they pin)."""
    files = _project_code()
    assert len(files) > 50, "the project's files were not found"
    assert library_private_uses(files, PACKAGE) == []


def test_checker_finds_a_librarys_private_names(tmp_path):
    """A private module or name of a library, imported or reached through an imported module, is named;
    dunders, a private top-level module, the project's own names and a script's sibling are left to rule 4."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from ray._private.state import actors\nfrom torch.nn.modules.batchnorm import _BatchNorm\n",
            "pkg/b.py": "def f():\n    import torch.cuda as cuda\n    cuda._sleep(1)\n",
            "pkg/c.py": "import ray\nimport ray.util.state\nray._private.worker.global_worker\nray.util.state.list_actors()\n",
            "pkg/d.py": "from __future__ import annotations\nimport _thread\nfrom pkg.a import _x\nimport os\nos.__file__\n",
            "bench/helper.py": "_h = 1\n",
            "bench/run.py": "import helper\nhelper._h\n",
        },
    )
    files = sorted(tmp_path.rglob("*.py"))
    assert library_private_uses(files, pkg) == sorted(
        [
            f"{tmp_path}/pkg/a.py:1 imports ray._private.state.actors",
            f"{tmp_path}/pkg/a.py:2 imports torch.nn.modules.batchnorm._BatchNorm",
            f"{tmp_path}/pkg/b.py:3 uses torch.cuda._sleep",
            f"{tmp_path}/pkg/c.py:3 uses ray._private",
        ]
    )


# ------------------------------------------------------------------- rule 5: the pure algorithm core
def algorithm_violations(package: Path, names: list[str]) -> list[str]:
    """What makes an algorithm module impure: a missing file, an import beyond the standard library,
    numpy and torch, an import of another algorithm module, or a helper module of the package that is
    not pure itself."""
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "__future__", package.name}
    modules = _package_modules(package)
    found = []
    for name in names:
        own = f"{package.name}.{name}"
        path = package.joinpath(*name.split(".")).with_suffix(".py")
        if not path.is_file():
            found.append(f"{path.relative_to(package.parent)} is missing: it is part of the fixed layout")
            continue
        roots = _imported_roots(path, own)
        if not roots:
            found.append(f"{own} imports nothing at all: the parser found no imports")
        found += [f"{own} imports {r}" for r in sorted(roots - allowed)]
        for _, helper in sorted(set(_imported_modules(path, own, modules))):
            if helper.removeprefix(f"{package.name}.") in names:
                found.append(f"{own} imports the algorithm module {helper}")
                continue
            impure = _imported_roots(modules[helper], helper) - (allowed - {package.name})
            if impure:
                found.append(f"{helper} (imported by {own}) is not pure: it imports {sorted(impure)}")
    return found


def test_algorithm_modules_import_neither_ray_nor_each_other():
    """Each algorithm module imports only the standard library, numpy, torch and pure helper
    modules of the package that import only those themselves (packing -> binpack), never each other."""
    assert algorithm_violations(PACKAGE, ALGORITHM_MODULES) == []


def test_checker_finds_an_impure_algorithm_module(tmp_path):
    """An algorithm module importing ray, another algorithm module or an impure helper is caught."""
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/packing.py": "import numpy\nfrom pkg.helper import h\n",
            "pkg/helper.py": "import pandas\n",
            "pkg/averaging.py": "import torch\ndef f():\n    import ray\n    from pkg import packing\n",
        },
    )
    assert algorithm_violations(pkg, ["packing", "averaging", "refurbish"]) == [
        "pkg.helper (imported by pkg.packing) is not pure: it imports ['pandas']",
        "pkg.averaging imports ray",
        "pkg.averaging imports the algorithm module pkg.packing",
        "pkg/refurbish.py is missing: it is part of the fixed layout",
    ]


def import_probe(modules: list[str], cwd: Path) -> dict:
    """Import ``modules`` in a fresh interpreter: is ray loaded, and how many threads run afterwards."""
    code = (
        "import sys, threading, json\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "print(json.dumps({'ray': 'ray' in sys.modules, 'threads': threading.active_count()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=cwd)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_core_starts_nothing():
    """Importing the package and its pure modules loads no ray and starts no thread pool."""
    core = ["raytrain_seq", *(f"raytrain_seq.{name}" for name in ALGORITHM_MODULES)]
    assert import_probe(core, ROOT) == {"ray": False, "threads": 1}


def test_checker_probe_sees_ray_and_a_thread(tmp_path):
    """The import probe reports a module that loads (a stand-in for) ray and starts a thread."""
    _write_tree(
        tmp_path,
        {
            "noisy.py": textwrap.dedent(
                """\
                import sys, threading, time, types
                sys.modules.setdefault("ray", types.ModuleType("ray"))
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                """
            )
        },
    )
    assert import_probe(["noisy"], tmp_path) == {"ray": True, "threads": 2}


# -------------------------------------------------------------- rule 7: no path outside the repository
def outside_citations(files: Iterable[Path], root: Path) -> list[str]:
    """Lines of ``files`` that cite the seed design document, its shared folder, or a ``../`` path that
    leaves ``root`` from the file's folder."""
    found = []
    for path in files:
        for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
            why = [reason for pattern, reason in OUTSIDE_PATTERNS.items() if re.search(pattern, text)]
            for match in RELATIVE_PATH.finditer(text):
                target = Path(os.path.normpath(path.parent / match.group(1)))
                if not target.is_relative_to(root):
                    why.append(f"{match.group(1)} leads out of the repository")
            found += [f"{path.relative_to(root)}:{number}: {reason}" for reason in why]
    return found


def _project_text_files() -> list[Path]:
    files = _git_files(ROOT)
    if files is None:  # no git: walk the tree, leaving out what ruff and git leave out here
        skip = RUFF_DEFAULT_EXCLUDES | {"__pycache__", ".pytest_cache"}
        files = [
            p
            for p in ROOT.rglob("*")
            if p.is_file()
            and not any(part in skip or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
        ]
    return sorted(p for p in files if p.suffix in CITING_SUFFIXES)


def test_no_file_cites_a_path_outside_the_repository():
    """No .py, .md, .sh, .yaml or .toml file of the project names the seed design document, the seed's
    shared folder, or a relative path that leaves the repository: a reader of the repository has
    nothing else, and docs/ARCHITECTURE.md is the design."""
    files = _project_text_files()
    assert {"README.md", "pyproject.toml"} <= {p.name for p in files}, "the project's files were not found"
    assert outside_citations(files, ROOT) == []


def test_checker_finds_citations_outside_the_repository(tmp_path):
    """The seed document's name, its shared folder and a ``../`` escaping the repository are caught;
    a ``../`` that stays inside (a doc linking a sibling folder) is not."""
    seed, up = "DESIGN" + ".md", os.pardir + "/"
    repo = tmp_path / "repo"
    _write_tree(
        repo,
        {
            "a.py": f'"""The rules of {seed}."""\n',
            "docs/b.md": f"![x]({up}bench/x.png) and [y]({up}{up}elsewhere/y.md)\n",
            "c.sh": f"cat {up}shared/spec.txt\n",
            "d.toml": "x = 1\n",
        },
    )
    files = sorted(p for p in repo.rglob("*") if p.is_file())
    assert outside_citations(files, repo) == [
        "a.py:1: " + OUTSIDE_PATTERNS[r"\bDESIGN\.md\b"],
        "c.sh:1: " + OUTSIDE_PATTERNS[r"\.\./shared\b"],
        f"c.sh:1: {up}shared/spec.txt leads out of the repository",
        f"docs/b.md:1: {up}{up}elsewhere/y.md leads out of the repository",
    ]


# ------------------------------------------------------------- rule 8: tests start Ray in one place
def ray_init_violations(test_files: Iterable[Path]) -> list[str]:
    """``ray.init`` calls in tests that may attach to a cluster already on the machine (no ``address=``)
    or that copy the shared local-cluster fixture outside conftest.py (``address="local"``). conftest.py
    may pass ``**options``: ``test_shared_ray_cluster_is_always_local`` pins what they hold."""
    found = []
    for path in test_files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and _dotted(node.func) == "ray.init"):
                continue
            address = next((k.value for k in node.keywords if k.arg == "address"), None)
            if address is None and path.name == "conftest.py" and any(k.arg is None for k in node.keywords):
                continue
            if address is None:
                found.append(
                    f"{path.name}:{node.lineno} ray.init without address= may attach to another cluster"
                )
            elif (
                isinstance(address, ast.Constant) and address.value == "local" and path.name != "conftest.py"
            ):
                found.append(
                    f"{path.name}:{node.lineno} starts its own local cluster: use conftest's ray_cluster"
                )
    return found


def test_tests_start_ray_only_through_the_shared_fixture():
    """tests/conftest.py's ``ray_cluster`` is the one place a test starts a local Ray cluster; a test that
    needs another (tests/test_faults.py's several raylets) attaches to the address it made."""
    test_files = sorted((ROOT / "tests").glob("*.py"))
    assert ROOT / "tests" / "conftest.py" in test_files, "tests/conftest.py holds the shared Ray fixture"
    assert ray_init_violations(test_files) == []


def test_shared_ray_cluster_is_always_local():
    """conftest's ray_cluster starts ``ray.init(address="local", ...)`` whatever a module's RAY_CLUSTER
    asks, and refuses a RAY_CLUSTER that names another address."""
    from conftest import RAY_DEFAULTS, ray_init_options

    assert ray_init_options(None) == {"address": "local", **RAY_DEFAULTS}
    assert ray_init_options({"num_cpus": 4, "namespace": "n"})["address"] == "local"
    assert ray_init_options({"num_cpus": 4})["num_cpus"] == 4
    with pytest.raises(ValueError, match="private local cluster"):
        ray_init_options({"address": "auto"})


def test_checker_finds_a_copied_ray_fixture(tmp_path):
    """A bare ``ray.init()`` and a local-cluster fixture copied into a test file are both caught."""
    _write_tree(
        tmp_path,
        {
            "test_a.py": "import ray\nray.init(num_cpus=2)\n",
            "test_b.py": "def f(ray):\n    ray.init(address='local')\n    ray.init(address=cluster.address)\n",
            "conftest.py": "import ray\nray.init(address='local')\nray.init(**options)\n",
            "test_c.py": "import ray\nray.init(**options)\n",
        },
    )
    assert ray_init_violations(sorted(tmp_path.glob("*.py"))) == [
        "test_a.py:2 ray.init without address= may attach to another cluster",
        "test_b.py:2 starts its own local cluster: use conftest's ray_cluster",
        "test_c.py:2 ray.init without address= may attach to another cluster",
    ]


# ------------------------------------------------------------------- rule 9: functions of one sitting
MAX_FUNCTION_LINES = 80


def long_functions(root: Path, folders: tuple[str, ...], limit: int) -> dict[str, int]:
    """``"path:name": lines`` of every function (nested ones too) under ``folders`` longer than ``limit``."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    key = f"{path.relative_to(root).as_posix()}:{node.name}"
                    if lines > limit:
                        found[key] = max(lines, found.get(key, 0))
    return found


def test_no_function_is_longer_than_one_sitting():
    """No function of raytrain_seq/ or bench/ is over 80 lines."""
    assert long_functions(ROOT, ("raytrain_seq", "bench"), MAX_FUNCTION_LINES) == {}


def test_checker_finds_a_long_function_nested_or_async(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(6))
    _write_tree(
        tmp_path,
        {
            "pkg/a.py": f"def short():\n    pass\n\ndef outer():\n    def inner():\n{body.replace('    ', '        ')}\n",
            "pkg/b.py": f"async def waits():\n{body}",
        },
    )
    assert long_functions(tmp_path, ("pkg",), 5) == {
        "pkg/a.py:inner": 7,
        "pkg/a.py:outer": 8,
        "pkg/b.py:waits": 7,
    }


# ------------------------------------------------------- rule 10: no dates or measured figures in code
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# The measured figures the before-stop hook looks for in the package's code (a rate, a time, a speed-up).
FIGURE = re.compile(r"[0-9][0-9,.]* ?(frames/s|MB/s|ms|x faster|s per)")


def dated_or_measured(root: Path, folders: tuple[str, ...]) -> list[str]:
    """``path:line`` of every line of the .py files under ``folders`` with a date or a measured figure."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if DATE.search(line) or FIGURE.search(line):
                    found.append(f"{path.relative_to(root).as_posix()}:{number}")
    return found


def test_the_package_code_cites_sections_not_dates_or_figures():
    """Measurements live in docs/ and bench/results/; the code cites a stable section of them (docs/ARCHITECTURE.md,
    "Measurements behind the code"), never docs/LOG.md by date, never a figure."""
    assert dated_or_measured(ROOT, ("raytrain_seq", "jobs")) == []
    assert "## Measurements behind the code" in (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def test_checker_finds_dates_and_figures(tmp_path):
    _write_tree(
        tmp_path,
        {
            "pkg/a.py": "# fine: docs/ARCHITECTURE.md\n# see docs/LOG.md, 2026-11-24\n",
            "pkg/b.py": '"""It reads 7,500 frames/s."""\nx = 1  # took 12 ms\n',
        },
    )
    assert dated_or_measured(tmp_path, ("pkg",)) == ["pkg/a.py:2", "pkg/b.py:1", "pkg/b.py:2"]


# ------------------------------------------------------------------------------------------ fixtures
def _write_tree(base: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``base``; return the first top-level folder (the
    package of a synthetic example) or ``base``."""
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    first = Path(next(iter(files))).parts
    return base / first[0] if len(first) > 1 else base


# ------------------------------------------ rule 12: no class over 20 methods, no module over 600 lines
MAX_METHODS = 20
MAX_MODULE_LINES = 600
# Today's exceptions, each at its size now: it may shrink (then lower or drop its entry), never grow.
# They are the parts an open issue splits next (docs/ARCHITECTURE.md, "Layout").
BIG_CLASSES: dict[str, int] = {}
BIG_MODULES: dict[str, int] = {}


def oversized(root: Path, folders: tuple[str, ...], max_methods: int, max_lines: int) -> dict[str, int]:
    """``{"path:Class": methods}`` of the classes over ``max_methods`` methods and ``{"path": lines}`` of
    the modules over ``max_lines`` lines, under ``folders`` (nested classes count on their own)."""
    found: dict[str, int] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text()
            name = path.relative_to(root).as_posix()
            lines = len(text.splitlines())
            if lines > max_lines:
                found[name] = lines
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
                    if methods > max_methods:
                        found[f"{name}:{node.name}"] = methods
    return found


def test_no_class_or_module_grows_past_one_concept():
    """No class of raytrain_seq/ has over 20 methods and no module over 600 lines, but for the listed
    exceptions, which may not grow; an exception that shrank below the bar must leave the list."""
    found = oversized(ROOT, ("raytrain_seq",), MAX_METHODS, MAX_MODULE_LINES)
    allowed = {**BIG_CLASSES, **BIG_MODULES}
    grown = {k: (v, allowed.get(k)) for k, v in found.items() if v > allowed.get(k, 0)}
    assert not grown, f"over the bar (found, allowed): {grown}: split by concept"
    stale = sorted(set(allowed) - set(found))
    assert not stale, f"these are within the bar now: drop them from the exceptions: {stale}"


def test_checker_finds_a_big_class_and_a_long_module(tmp_path):
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(4))
    _write_tree(
        tmp_path, {"pkg/a.py": f"class Big:\n{methods}\nclass Small:\n    def m(self):\n        pass\n"}
    )
    assert oversized(tmp_path, ("pkg",), 3, 100) == {"pkg/a.py:Big": 4}
    assert oversized(tmp_path, ("pkg",), 5, 10) == {"pkg/a.py": 13}


# --------------------------------------------- rule 13: a module docstring is read at a glance
MAX_DOCSTRING_LINES = 15
DOCSTRING_FOLDERS = ("raytrain_seq", "jobs", "bench")


def long_module_docstrings(root: Path, folders: tuple[str, ...], limit: int) -> dict[str, int]:
    """``{"path": lines}`` of every module under ``folders`` whose docstring literal runs over ``limit``
    lines (its first line and its closing quotes count): what the module is for and its contract; its
    history, trade-offs and figures belong in docs/ARCHITECTURE.md or docs/LOG.md."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            body = ast.parse(path.read_text()).body
            first = body[0] if body else None
            is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if is_doc and isinstance(first.value.value, str):
                lines = first.end_lineno - first.lineno + 1
                if lines > limit:
                    found[path.relative_to(root).as_posix()] = lines
    return found


def test_every_module_docstring_is_read_at_a_glance():
    """No module docstring of raytrain_seq/, jobs/ or bench/ is over 15 lines."""
    assert long_module_docstrings(ROOT, DOCSTRING_FOLDERS, MAX_DOCSTRING_LINES) == {}


def test_checker_finds_a_long_module_docstring(tmp_path):
    long, short = "".join(f"line {i}\n" for i in range(5)), "One line."
    _write_tree(
        tmp_path,
        {
            "pkg/a.py": f'"""Summary.\n\n{long}"""\nx = 1\n',
            "pkg/b.py": f'"""{short}"""\n',
            "pkg/c.py": "x = 1\n",
            "pkg/d.py": f'x = 1\n"""{long}"""\n',
        },
    )
    assert long_module_docstrings(tmp_path, ("pkg",), 5) == {"pkg/a.py": 8}
    assert long_module_docstrings(tmp_path, ("pkg",), 8) == {}


# --------------------------------------------- rule 14: every cited section of the design exists
DESIGN = "docs/ARCHITECTURE" + ".md"
# A citation names the section in quotes right after the document ("docs/ARCHITECTURE.md, "Validation"",
# "(docs/ARCHITECTURE.md ("Start-up order")") or right before it (""Start-up" in docs/ARCHITECTURE.md").
# Comment markers and line breaks are joined first, so a citation may wrap. The patterns are built from
# pieces, so this file does not cite the document itself.
CITED_AFTER = re.compile(r"ARCHITECTURE\.md(?:\s*,\s*|\s*\(\s*|\s+)[\"']([^\"'\n]{1,80})[\"']")
CITED_BEFORE = re.compile(r"[\"']([^\"'\n]{1,80})[\"']\s+in\s+docs/ARCHITECTURE\.md")


def _joined(text: str) -> str:
    return " ".join(re.sub(r"^\s*(?:#+\s?)?", "", line) for line in text.splitlines())


def cited_sections_missing(files: Iterable[Path], root: Path, design: Path) -> list[str]:
    """``path: "name"`` of every section of ``design`` that a file of ``files`` cites by name and that
    no heading of ``design`` starts with (a trailing "..." of the name is dropped)."""
    headings = [
        re.sub(r"^#+\s*", "", line) for line in design.read_text().splitlines() if line.startswith("#")
    ]
    found = []
    for path in files:
        text = _joined(path.read_text(errors="replace"))
        for pattern in (CITED_AFTER, CITED_BEFORE):
            for match in pattern.finditer(text):
                name = match.group(1).strip().removesuffix("...").strip()
                if not any(heading.startswith(name) for heading in headings):
                    found.append(f'{path.relative_to(root).as_posix()}: "{match.group(1)}"')
    return sorted(set(found))


def test_every_cited_section_of_the_design_exists():
    """Code, tests and docs cite sections of docs/ARCHITECTURE.md by name: each one is still a heading."""
    files = _project_text_files()
    cites = sum(len(CITED_AFTER.findall(_joined(p.read_text(errors="replace")))) for p in files)
    assert cites >= 20, f"only {cites} citations found: the pattern no longer sees them"
    assert cited_sections_missing(files, ROOT, ROOT / DESIGN) == []


def test_checker_finds_a_cited_section_that_is_gone(tmp_path):
    design = _write_tree(
        tmp_path, {DESIGN: "# Design\n\n## Kept section\n\n### The frame cache (real video)\n"}
    )
    doc = "ARCHITECTURE" + ".md"
    _write_tree(
        tmp_path,
        {
            "pkg/a.py": f'# the reason: docs/{doc}, "Kept section".\n# (docs/{doc}\n# "The frame cache")\n',
            "pkg/b.py": f'"""See docs/{doc} ("Gone section")."""\n',
            "pkg/c.py": f'x = 1  # "Kept ..." in docs/{doc}; "Also gone" in\n# docs/{doc}\n',
        },
    )
    files = sorted((tmp_path / "pkg").glob("*.py"))
    assert cited_sections_missing(files, tmp_path, design / "ARCHITECTURE.md") == [
        'pkg/b.py: "Gone section"',
        'pkg/c.py: "Also gone"',
    ]


# ------------------------------------------------------------------- rule 15: the top level by concept
TOP_LEVEL_MODULES = 8


def layout_violations(package: Path, most: int) -> list[str]:
    """What breaks the layout: more than ``most`` modules directly in ``package`` (``__init__`` aside), or
    a folder whose ``__init__`` has no docstring or one of more than one paragraph."""
    top = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    found = (
        [f"{package.name}/ holds {len(top)} modules ({', '.join(top)}): at most {most}"]
        if len(top) > most
        else []
    )
    for init in sorted(package.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        paragraphs = [p for p in doc.split("\n\n") if p.strip()]
        if len(paragraphs) != 1:
            found.append(
                f"{init.relative_to(package.parent)}: a one-paragraph docstring, not {len(paragraphs)}"
            )
    return found


def test_the_top_level_holds_few_modules_and_each_folder_says_what_it_holds():
    """raytrain_seq/ keeps its entry points and the config tree at the top; everything else lives in a
    folder named for its concept, whose ``__init__`` says in one paragraph what it holds."""
    assert len(list(PACKAGE.glob("*/__init__.py"))) >= 10, "no folders seen"
    assert layout_violations(PACKAGE, TOP_LEVEL_MODULES) == []


def test_checker_finds_a_crowded_top_level_and_a_silent_folder(tmp_path):
    pkg = _write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "",
            "pkg/b.py": "",
            "pkg/c.py": "",
            "pkg/quiet/__init__.py": "x = 1\n",
            "pkg/long/__init__.py": '"""One.\n\nTwo."""\n',
            "pkg/good/__init__.py": '"""What it holds,\nin one paragraph."""\n',
        },
    )
    assert layout_violations(pkg, 2) == [
        "pkg/ holds 3 modules (a, b, c): at most 2",
        "pkg/long/__init__.py: a one-paragraph docstring, not 2",
        "pkg/quiet/__init__.py: a one-paragraph docstring, not 0",
    ]
    assert layout_violations(pkg, 3) == [v for v in layout_violations(pkg, 2) if "holds" not in v]


# ------------------------------------------ rule 16: no dict of Any between runtime/ and the learners
# What crosses between runtime/ and a learner process is typed: the learner's module (every function and
# method: its Ray Train entry, its reports, the loop) and the public methods of the actors the learners
# call across the process boundary and of the learner-side proxies they call them through.
LEARNER_BOUNDARY: dict[str, tuple[str, ...] | None] = {
    "raytrain_seq/runtime/learner.py": None,  # None: every function and method of the module
    "raytrain_seq/runtime/averager.py": ("ParameterAverager",),
    "raytrain_seq/runtime/feed.py": ("BlockFeed",),
    "raytrain_seq/runtime/learner_feed.py": ("LearnerFeed",),
    "raytrain_seq/rounds/client.py": ("AveragerClient",),
}
DICT_NAMES = frozenset({"dict", "Dict", "typing.Dict"})


def _dict_of_any(annotation: ast.expr | None) -> bool:
    """Whether ``annotation`` holds, anywhere (``X | None``, ``tuple[X, ...]``, a string annotation), a
    bare ``dict``/``Dict`` or a ``dict[str, Any]``/``Dict[str, Any]``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if annotation is None:
        return False
    subscripted = {id(n.value) for n in ast.walk(annotation) if isinstance(n, ast.Subscript)}
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and _dotted(node.value) in DICT_NAMES:
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else []
            if len(args) == 2 and _dotted(args[0]) == "str" and _dotted(args[1]) in ("Any", "typing.Any"):
                return True
        elif _dotted(node) in DICT_NAMES and id(node) not in subscripted:
            return True
    return False


def _boundary_functions(tree: ast.Module, classes: tuple[str, ...] | None) -> Iterator[ast.FunctionDef]:
    """Every function of the module (``classes`` None), else the public methods of ``classes``."""
    functions = ast.FunctionDef | ast.AsyncFunctionDef
    if classes is None:
        yield from (node for node in ast.walk(tree) if isinstance(node, functions))
        return
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            yield from (f for f in node.body if isinstance(f, functions) and not f.name.startswith("_"))


def untyped_boundary(root: Path, boundary: dict[str, tuple[str, ...] | None]) -> list[str]:
    """``path:line name(parameter): annotation`` of each parameter or return annotation in ``boundary``
    that holds a dict of Any; a named file or class that is missing is reported too."""
    found = []
    for name, classes in boundary.items():
        path = root / name
        if not path.is_file():
            found.append(f"{name} is missing: it is part of the learners' boundary")
            continue
        tree = ast.parse(path.read_text())
        defined = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        found += [f"{name}:{c} is missing" for c in classes or () if c not in defined]
        for function in _boundary_functions(tree, classes):
            a = function.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            slots = [(p.arg, p.annotation) for p in params] + [("return", function.returns)]
            found += [
                f"{name}:{function.lineno} {function.name}({slot}): {ast.unparse(annotation)}"
                for slot, annotation in slots
                if _dict_of_any(annotation)
            ]
    return found


def test_nothing_between_runtime_and_the_learners_is_a_dict_of_any():
    """The learner's module and the public methods of the averager, the feed and the learners' proxies of
    them take and return typed values (``LearnerLaunch``, ``LearnerReport``, ``ModelSpec``, ...), never a
    ``dict[str, Any]`` or a bare ``dict``."""
    assert untyped_boundary(ROOT, LEARNER_BOUNDARY) == []


def test_checker_finds_a_dict_of_any_in_the_learners_boundary(tmp_path):
    """A bare dict, a ``Dict[str, Any]`` inside a union, a string annotation and a ``dict[str, Any]``
    in a tuple are caught; a private method of a listed class, a class not listed and a typed dict are not."""
    _write_tree(
        tmp_path,
        {
            "pkg/learner.py": textwrap.dedent(
                """\
                from typing import Any, Dict
                def loop(config: dict) -> "dict[str, Any] | None":
                    def inner(x: dict[str, int]) -> Dict[str, Any] | None: ...
                """
            ),
            "pkg/actor.py": textwrap.dedent(
                """\
                class Actor:
                    def stats(self, *, ids: bool = False) -> tuple[int, dict[str, Any]]: ...
                    async def spec(self, **kw: Dict) -> dict[str, float]: ...
                    def _private(self) -> dict[str, Any]: ...
                class Other:
                    def stats(self) -> dict[str, Any]: ...
                """
            ),
        },
    )
    boundary = {"pkg/learner.py": None, "pkg/actor.py": ("Actor", "Gone"), "pkg/gone.py": ("X",)}
    assert untyped_boundary(tmp_path, boundary) == [
        "pkg/learner.py:2 loop(config): dict",
        "pkg/learner.py:2 loop(return): 'dict[str, Any] | None'",
        "pkg/learner.py:3 inner(return): Dict[str, Any] | None",
        "pkg/actor.py:Gone is missing",
        "pkg/actor.py:2 stats(return): tuple[int, dict[str, Any]]",
        "pkg/actor.py:3 spec(kw): Dict",
        "pkg/gone.py is missing: it is part of the learners' boundary",
    ]
