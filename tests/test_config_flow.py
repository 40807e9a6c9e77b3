"""Where the whole ``Config`` travels from ``runtime/driver.py:run`` (issue 51, "Each part owns its settings").

The measure, on the source with the AST (nothing is imported or run):

* **The walk.** It starts in ``run`` of ``raytrain_seq/runtime/driver.py`` with its parameter ``config``
  holding the tree, and reads each function it reaches in source order (arguments before their call,
  nested functions and lambdas as part of the function that holds them). A value *bears the tree* when it
  is the tree (a bound name; ``Config.from_dict(...)``, the tree rebuilt; ``x.named()`` of a bearer), a
  dict, list or tuple holding a bearer, an item of a bearer, an instance of a package class with a field that bears it (a
  dataclass field annotated ``Config``, or ``self.x = <bearer>`` in its ``__init__``), or such a field
  (``state.config``, ``self._config``). A call that is handed a bearer (positionally or by keyword) and
  resolves to a function or class of the package (a module's own def, an import, ``module.f``,
  ``Class.method``, ``self.method``, ``ray.remote(C)...remote(...)``, ``task.options(...).remote(...)``)
  is a **visit** of the callee's file; the walk enters it with its parameters bound (a class: its
  ``__init__``, then each other method that reads a bearing ``self`` field). The tree as plain data
  (``x.to_dict()``) is a record (summary.json, a checkpoint) and bears nothing, except where it crosses to
  another process to be rebuilt: a package function handed to an outside call together with a bearer or
  its ``to_dict()`` (Ray Train's ``train_loop_per_worker``) is walked, and it is a visit where it rebuilds
  the tree (``Config.from_dict``). ``raytrain_seq/config/`` is the tree's own home: calls into it are
  not visits. A function already on the walk's stack is not entered again.
* **Stays.** The visits in walk order, consecutive visits of one file merged into one stay.
* **Returns.** Stays in a file that an earlier stay was in (the tree came back to a file it had left).
* **Climbs.** Moves from one stay to the next whose file sits at a higher floor of the package: floor 0
  is a module at the top of ``raytrain_seq/``, floor 1 one in a folder of it (``runtime/driver.py``).

The target (issue 51, item 1): at most 6 returns and at most 2 climbs. ``python tests/test_config_flow.py``
prints the walk's stays and the three counts.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raytrain_seq"
START = ("runtime/driver.py", "run", "config")
TARGET_RETURNS = 2 * 3  # issue 51: at most 6 returns
TARGET_CLIMBS = 2  # and at most two climbs back up a floor
TREE_CLASS = "Config"
TREE_HOME = "config/"  # the tree's own package: calls into any of its modules are not visits
TREE_METHODS = ("named",)  # Config methods whose result is the tree again
PLAIN = "to_dict"  # the tree as plain data: a record, rebuilt only by Config.from_dict
MAX_VISITS = 5000


@dataclasses.dataclass
class _Class:
    module: _Module
    node: ast.ClassDef
    tree_fields: set[str] = dataclasses.field(default_factory=set)

    @property
    def methods(self) -> dict[str, ast.FunctionDef]:
        return {n.name: n for n in self.node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@dataclasses.dataclass
class _Module:
    name: str  # dotted
    path: Path
    rel: str  # relative to the package
    tree: ast.Module
    functions: dict[str, ast.FunctionDef] = dataclasses.field(default_factory=dict)
    classes: dict[str, _Class] = dataclasses.field(default_factory=dict)
    imports: dict[str, str] = dataclasses.field(default_factory=dict)  # local name -> dotted target

    @property
    def floor(self) -> int:
        return self.rel.count("/")


class FlowIndex:
    """Every module of a package, its defs, classes and imports (function-local imports included)."""

    def __init__(self, package: Path) -> None:
        self.package = package
        self.modules: dict[str, _Module] = {}
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(package).as_posix()
            parts = [package.name, *rel[:-3].split("/")]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            self.modules[name] = module = _Module(name, path, rel, ast.parse(path.read_text(), str(path)))
            self._index(module)

    def _index(self, module: _Module) -> None:
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                cls = module.classes[node.name] = _Class(module, node)
                for item in node.body:  # dataclass fields annotated as the tree
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and TREE_CLASS in ast.unparse(item.annotation).replace('"', "").split(" | ")
                    ):
                        cls.tree_fields.add(item.target.id)
        package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], base])
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = f"{base.strip('.')}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        module.imports[alias.asname] = alias.name

    def symbol(self, dotted: str, depth: int = 0) -> tuple[str, object] | None:
        """``("module", _Module)``, ``("function", (module, def))`` or ``("class", _Class)`` for a dotted name."""
        if dotted in self.modules:
            return "module", self.modules[dotted]
        owner, _, name = dotted.rpartition(".")
        module = self.modules.get(owner)
        if module is None or depth > 8:
            return None
        if name in module.functions:
            return "function", (module, module.functions[name])
        if name in module.classes:
            return "class", module.classes[name]
        if name in module.imports:  # a re-export
            return self.symbol(module.imports[name], depth + 1)
        return None

    def local(self, module: _Module, name: str) -> tuple[str, object] | None:
        if name in module.functions:
            return "function", (module, module.functions[name])
        if name in module.classes:
            return "class", module.classes[name]
        if name in module.imports:
            return self.symbol(module.imports[name])
        return None


@dataclasses.dataclass
class Flow:
    """The walk's visits (file, function) and what they add up to."""

    visits: list[tuple[str, str]]
    floors: dict[str, int]

    @property
    def stays(self) -> list[str]:
        stays: list[str] = []
        for file, _ in self.visits:
            if not stays or stays[-1] != file:
                stays.append(file)
        return stays

    @property
    def files(self) -> set[str]:
        return set(self.stays)

    @property
    def returns(self) -> int:
        stays = self.stays
        return sum(1 for i, file in enumerate(stays) if file in stays[:i])

    @property
    def climbs(self) -> int:
        stays = self.stays
        return sum(1 for a, b in itertools.pairwise(stays) if self.floors[b] < self.floors[a])

    def describe(self) -> str:
        return f"{len(self.stays)} stays in {len(self.files)} files, {self.returns} returns, {self.climbs} climbs"


class _Scope:
    """What one function's names hold while the walk reads it: bearers, and instances of package classes."""

    def __init__(self, module: _Module, cls: _Class | None, name: str, recorded: bool) -> None:
        self.module, self.cls, self.name, self.recorded = module, cls, name, recorded
        self.bearing: set[str] = set()
        self.types: dict[str, _Class] = {}


class ConfigFlow:
    """The walk (this module's docstring) over one package."""

    def __init__(self, package: Path) -> None:
        self.index = FlowIndex(package)
        self.visits: list[tuple[str, str]] = []
        self._stack: list[int] = []

    def run(self, rel: str, function: str, parameter: str) -> Flow:
        module = next(m for m in self.index.modules.values() if m.rel == rel)
        node = module.functions[function]
        self.visits.append((module.rel, node.name))
        self._enter(module, None, node, {parameter: "tree"})
        floors = {m.rel: m.floor for m in self.index.modules.values()}
        return Flow(list(self.visits), floors)

    # ------------------------------------------------------------------------------------ bearers
    def _bears(self, scope: _Scope, node: ast.AST | None) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.Name):
            return node.id in scope.bearing or bool(
                node.id in scope.types and scope.types[node.id].tree_fields
            )
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                owner = scope.cls if node.value.id == "self" else scope.types.get(node.value.id)
                if owner is not None and node.attr in owner.tree_fields:
                    return True
            return False
        if isinstance(node, ast.Subscript):
            return self._bears(scope, node.value)
        if isinstance(node, ast.Starred):
            return self._bears(scope, node.value)
        if isinstance(node, ast.Dict):
            return any(self._bears(scope, v) for v in node.values)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(self._bears(scope, v) for v in node.elts)
        if isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in TREE_METHODS
                and self._bears(scope, func.value)
            ):
                return True
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "from_dict"
                and isinstance(func.value, ast.Name)
            ):
                found = self.index.local(scope.module, func.value.id)
                return found is not None and found[0] == "class" and found[1].node.name == TREE_CLASS
        return False

    def _plain(self, scope: _Scope, node: ast.AST) -> bool:
        """``node`` holds the tree as plain data: ``x.to_dict()`` of a bearer, or a dict, tuple, list or
        call holding one (``LoopConfig(config=config.to_dict(), ...)``, a record wrapped for the trip)."""
        if isinstance(node, ast.Dict):
            return any(self._plain(scope, v) for v in node.values)
        if isinstance(node, ast.Tuple | ast.List):
            return any(self._plain(scope, v) for v in node.elts)
        if not isinstance(node, ast.Call):
            return False
        if isinstance(node.func, ast.Attribute) and node.func.attr == PLAIN:
            return self._bears(scope, node.func.value)
        inner = [*node.args, *(k.value for k in node.keywords)]
        return any(self._bears(scope, v) or self._plain(scope, v) for v in inner)

    def _instance(self, scope: _Scope, node: ast.AST) -> _Class | None:
        """The package class ``node`` constructs (``C(...)``) or returns (``f(...)`` annotated ``-> C``)."""
        if not isinstance(node, ast.Call):
            return None
        found = self._callee(scope, node.func)
        if found is not None and found[0] == "class":
            return found[1]
        if found is not None and found[0] in ("function", "method"):
            owner, function = found[1]
            module = owner if isinstance(owner, _Module) else owner.module
            if function.returns is not None:
                name = ast.unparse(function.returns).strip("'\"")
                made = self.index.local(module, name)
                if made is not None and made[0] == "class":
                    return made[1]
        return None

    # ------------------------------------------------------------------------------------ callees
    def _callee(self, scope: _Scope, func: ast.expr) -> tuple[str, object] | None:
        index = self.index
        if isinstance(func, ast.Name):
            return index.local(scope.module, func.id)
        if not isinstance(func, ast.Attribute):
            if isinstance(func, ast.Call):  # ray.remote(num_cpus=0)(C)
                return None
            return None
        if func.attr == "remote":  # ray.remote(C).options(...).remote(...), task.options(...).remote(...)
            return self._remote_target(scope, func.value)
        if isinstance(func.value, ast.Name):
            name = func.value.id
            if name == "self" and scope.cls is not None:
                method = scope.cls.methods.get(func.attr)
                return None if method is None else ("method", (scope.cls, method))
            owner = index.local(scope.module, name)
            if owner is not None and owner[0] == "module":
                return index.local(owner[1], func.attr)
            if owner is not None and owner[0] == "class":
                method = owner[1].methods.get(func.attr)
                return None if method is None else ("method", (owner[1], method))
        return None

    def _remote_target(self, scope: _Scope, node: ast.expr) -> tuple[str, object] | None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                for arg in sub.args:
                    if isinstance(arg, ast.Name):
                        found = self.index.local(scope.module, arg.id)
                        if found is not None and found[0] in ("class", "function"):
                            return found
            if isinstance(sub, ast.Name):
                found = self.index.local(scope.module, sub.id)
                if found is not None and found[0] in ("class", "function"):
                    return found
        return None

    # ------------------------------------------------------------------------------------ walking
    def _enter(self, module: _Module, cls: _Class | None, node: ast.AST, bound: dict[str, object]) -> None:
        if id(node) in self._stack or len(self.visits) > MAX_VISITS:
            return
        self._stack.append(id(node))
        name = node.name if cls is None else f"{cls.node.name}.{node.name}"
        scope = _Scope(module, cls, name, recorded=bool(bound))
        for name, what in bound.items():
            if what == "tree":
                scope.bearing.add(name)
            elif isinstance(what, _Class):
                scope.types[name] = what
        for statement in node.body:
            self._statement(scope, statement)
        self._stack.pop()

    def _statement(self, scope: _Scope, node: ast.AST) -> None:
        """Read ``node`` in source order: calls (arguments first), then what assignments bind."""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for child in ast.iter_child_nodes(node):
                self._statement(scope, child)
            return
        if isinstance(node, ast.Assign | ast.AnnAssign):
            if node.value is not None:
                self._statement(scope, node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                self._bind(scope, target, node.value)
            return
        for child in ast.iter_child_nodes(node):
            self._statement(scope, child)
        if isinstance(node, ast.Call):
            self._call(scope, node)

    def _bind(self, scope: _Scope, target: ast.AST, value: ast.AST | None) -> None:
        if (
            isinstance(target, ast.Tuple)
            and isinstance(value, ast.Tuple)
            and len(target.elts) == len(value.elts)
        ):
            for t, v in zip(target.elts, value.elts, strict=True):
                self._bind(scope, t, v)
            return
        if isinstance(target, ast.Name):
            made = self._instance(scope, value) if value is not None else None
            bears = self._bears(scope, value)
            scope.bearing.discard(target.id)
            scope.types.pop(target.id, None)
            if made is not None and made.node.name != TREE_CLASS:
                scope.types[target.id] = made
            elif bears:
                scope.bearing.add(target.id)
                if not scope.recorded:  # the tree rebuilt here (a callback walked without it)
                    scope.recorded = True
                    self._record(scope.module, scope.name)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and scope.cls is not None
            and self._bears(scope, value)
        ):
            scope.cls.tree_fields.add(target.attr)

    def _call(self, scope: _Scope, call: ast.Call) -> None:
        args = list(call.args)
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        values = [*args, *keywords.values()]
        found = self._callee(scope, call.func)
        if found is None:  # an outside call: a package function handed with the tree or its plain data
            if any(self._bears(scope, v) or self._plain(scope, v) for v in values):
                for arg in args:
                    callback = self.index.local(scope.module, arg.id) if isinstance(arg, ast.Name) else None
                    if (
                        callback is not None
                        and callback[0] == "function"
                        and not callback[1][0].rel.startswith(TREE_HOME)
                    ):
                        self._enter(*callback[1][:1], None, callback[1][1], {})
            return
        if not any(self._bears(scope, v) for v in values):
            return
        kind, what = found
        if kind == "function":
            module, node = what
            self._visit(module, None, node, self._binding(scope, node, args, keywords, method=False))
        elif kind == "method":
            cls, node = what
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
            self._visit(cls.module, cls, node, self._binding(scope, node, args, keywords, method=not static))
        elif kind == "class":
            self._construct(scope, what, args, keywords)

    def _construct(self, scope: _Scope, cls: _Class, args: list, keywords: dict) -> None:
        init = cls.methods.get("__init__")
        if init is None:  # a dataclass: the bearing arguments become bearing fields
            fields = [
                n.target.id
                for n in cls.node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            ]
            for name, arg in [*zip(fields, args, strict=False), *keywords.items()]:
                if self._bears(scope, arg):
                    cls.tree_fields.add(name)
            self._record(cls.module, cls.node.name)
            return
        self._visit(cls.module, cls, init, self._binding(scope, init, args, keywords, method=True))
        for name, method in cls.methods.items():  # the methods that read a bearing field of self
            if name != "__init__" and any(
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
                and n.attr in cls.tree_fields
                for n in ast.walk(method)
            ):
                self._visit(cls.module, cls, method, {})

    def _binding(self, scope: _Scope, node: ast.AST, args: list, keywords: dict, *, method: bool) -> dict:
        params = [a.arg for a in node.args.posonlyargs + node.args.args]
        if method and params:
            params = params[1:]
        named = {a.arg: a for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
        bound: dict[str, object] = {}
        for name, arg in [*zip(params, args, strict=False), *keywords.items()]:
            if name not in named:
                continue
            if isinstance(arg, ast.Name) and arg.id in scope.types:
                bound[name] = scope.types[arg.id]  # an instance: its bearing fields go with it
            elif self._bears(scope, arg):
                bound[name] = "tree"
        return bound

    def _record(self, module: _Module, name: str) -> None:
        self.visits.append((module.rel, name))

    def _visit(self, module: _Module, cls: _Class | None, node: ast.AST, bound: dict) -> None:
        if module.rel.startswith(TREE_HOME):
            return
        self._record(module, node.name if cls is None else f"{cls.node.name}.{node.name}")
        self._enter(module, cls, node, bound)


def config_flow(package: Path = PACKAGE, start: tuple[str, str, str] = START) -> Flow:
    return ConfigFlow(package).run(*start)


# ------------------------------------------------------------------------------------------------ tests
def test_the_whole_config_stays_near_the_driver():
    flow = config_flow()
    assert flow.returns <= TARGET_RETURNS and flow.climbs <= TARGET_CLIMBS, (
        f"following config from runtime/driver.py:run: {flow.describe()} (target: at most {TARGET_RETURNS} "
        f"returns and {TARGET_CLIMBS} climbs); its stays: {' -> '.join(flow.stays)}. Hand a component its "
        "settings (raytrain_seq/parts.py), not the Config"
    )


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "raytrain_seq"
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in [package, *[p for p in package.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return package


PLANTED = {
    "config/__init__.py": """
        class Config:
            def named(self) -> "Config":
                return self
    """,
    "runtime/driver.py": """
        import dataclasses
        from raytrain_seq import preflight
        from raytrain_seq.config import Config
        from raytrain_seq.runtime.connect import connect
        from raytrain_seq.models.factory import build


        @dataclasses.dataclass
        class _Run:
            config: Config
            other: int


        def run(config: Config) -> None:
            config = config.named()
            preflight.check(config)
            connect(config)
            state = _Run(config, 1)
            _start(state)


        def _start(state: _Run) -> None:
            build(state.config)
            connect(state.config.train)  # a section: not the tree
    """,
    "preflight.py": """
        from raytrain_seq.models.factory import build

        def check(config):
            build(config)
            _paths(config)

        def _paths(config):
            return config.data
    """,
    "runtime/connect.py": """
        def connect(config):
            return config.run
    """,
    "models/factory.py": """
        from raytrain_seq.runtime.feed import Feed

        def build(config):
            Feed(config)
    """,
    "runtime/feed.py": """
        class Feed:
            def __init__(self, config):
                self._config = config

            def stats(self):
                return self._config.train

            def other(self):
                return 1
    """,
}


def test_checker_follows_the_tree_through_calls_fields_and_classes(tmp_path):
    """A planted package: run -> preflight -> factory -> feed (its __init__ and the method reading
    self._config) -> preflight again -> connect -> driver (the _Run carrier) -> factory -> feed again."""
    flow = config_flow(_package(tmp_path, PLANTED))
    assert [f for f, _ in flow.visits] == [
        "runtime/driver.py",
        "preflight.py",
        "models/factory.py",
        "runtime/feed.py",
        "runtime/feed.py",
        "preflight.py",
        "runtime/connect.py",
        "runtime/driver.py",
        "runtime/driver.py",
        "models/factory.py",
        "runtime/feed.py",
        "runtime/feed.py",
    ]
    assert [n for _, n in flow.visits][3:5] == ["Feed.__init__", "Feed.stats"]
    # stays: driver, preflight, factory, feed, preflight, connect, driver, factory, feed
    assert len(flow.stays) == 9 and len(flow.files) == 5
    assert flow.returns == 4  # preflight, driver, factory, feed
    # climbs: runtime/driver (1) -> preflight (0), feed (1) -> preflight (0)
    assert flow.climbs == 2


def test_checker_follows_a_record_wrapped_for_another_process(tmp_path):
    """The tree's plain data inside a launch value handed to an outside call (Ray Train's trainer) with a
    package function: the function is walked, and its ``Config.from_dict`` is a visit of its file."""
    wrapped = dict(PLANTED)
    wrapped["runtime/driver.py"] = """
        from ray.train import Trainer
        from raytrain_seq.config import Config
        from raytrain_seq.runtime.launch import Loop
        from raytrain_seq.runtime.learner import loop

        def run(config: Config) -> None:
            Trainer(loop, train_loop_config=Loop(config=config.to_dict(), launch=1)).fit()
    """
    wrapped["runtime/launch.py"] = """
        class Loop(dict):
            pass
    """
    wrapped["runtime/learner.py"] = """
        from raytrain_seq.config import Config
        from raytrain_seq.runtime.connect import connect

        def loop(loop_config) -> None:
            config = Config.from_dict(loop_config["config"])
            connect(config)
    """
    flow = config_flow(_package(tmp_path, wrapped))
    assert flow.stays == ["runtime/driver.py", "runtime/learner.py", "runtime/connect.py"], flow.visits


def test_checker_leaves_a_narrowed_package_alone(tmp_path):
    """The same package with every part handed its own settings: one stay."""
    narrowed = dict(PLANTED)
    narrowed["runtime/driver.py"] = """
        from raytrain_seq import preflight

        def run(config) -> None:
            data, run = config.data, config.run
            preflight.check(data)
            preflight.check(config.train)
    """
    flow = config_flow(_package(tmp_path, narrowed))
    assert flow.stays == ["runtime/driver.py"] and flow.returns == 0 and flow.climbs == 0


if __name__ == "__main__":
    measured = config_flow(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE)
    for file, function in measured.visits:
        print(f"{file}:{function}")
    print(measured.describe())
