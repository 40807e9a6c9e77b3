"""The command line of the jobs, generated from the ``Config`` dataclass tree: flags -> Config -> runner.

Every field gets two spellings of one flag: the dotted ``--data.crop`` and the kebab ``--crop`` (field
names are unique across sections); booleans are switches (``--adaptive-batch``/``--no-adaptive-batch``).
The type comes from the annotation (``X | None`` also takes ``none``; a tuple takes that many values), the
help from the field's docstring and default. Precedence, lowest first: defaults, ``--preset NAME``,
``--config FILE`` (YAML or JSON laid out as ``Config.to_dict()``), the flags typed (every flag defaults to
absent). ``--print-config`` prints YAML that ``--config`` reads back to the same Config, an automatic
``run_name`` printed as ``null`` so the file repeats the run in a new folder.
Help in two tiers: the flags a user sets, then the tuning knobs (``ADVANCED``) in one "advanced" group;
dotted spellings work but are not listed. Flags are never abbreviated (``--epoch`` is an error naming
``--epochs``) and a file's key given twice is an error. A walker of our own, not tyro or jsonargparse:
no dependency, and the kebab forms (``--fuse A B``, ``--learners 2:8``) stay as they were. Values are
checked once, by the Config; the parser only turns text into the annotated type.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import logging
import math
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from raytrain_seq import preflight
from raytrain_seq.config import (
    PRESETS,
    RETIRED,
    Config,
    DataConfig,
    ModelConfig,
    RunConfig,
    RunSetupError,
    TrainConfig,
)
from raytrain_seq.outputs.summary import RunSummary, format_table

logger = logging.getLogger(__name__)

__all__ = [
    "ADVANCED",
    "FUSE_FIELDS",
    "SECTIONS",
    "build_parser",
    "config_from_args",
    "config_yaml",
    "field_docs",
    "load_config_file",
    "main",
    "parse",
    "run_job",
]

SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}
# Only where the annotation alone would give an unhelpful placeholder (a union, a pair).
_METAVARS: dict[str, str | tuple[str, ...]] = {
    "learners": "P|MIN:MAX",
    "micro_batch_size": "N|auto",
    "fuse": ("RGB_RUN", "FLOW_RUN"),
}
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_SHORT = {"verbose": "-v"}
# The runtime's tuning knobs: their defaults suit most runs, so --help lists them last, in one group.
ADVANCED: frozenset[str] = frozenset(
    {
        "data.augment_cost",
        "data.augment_cost_per_frame",
        "data.frame_cache_dir",
        "train.max_failures",
        "train.worker_start_timeout_s",
        "train.poll_interval_s",
        "train.averager_max_restarts",
        "train.feed_max_restarts",
        "train.keep_freed_memory",
        "train.merge_moments",
        "train.merge_bn_stats",
        "train.averager_timeout_s",
        "train.averager_shards",
        "train.averager_channels",
        "train.b1",
        "train.b2",
        "run.object_store_gb",
    }
)
# What fusion (runtime/fuse.py) reads besides the two run folders: jobs/fuse.py offers only these flags.
FUSE_FIELDS: tuple[str, ...] = (
    "data.dataset",
    "data.data_root",
    "data.test_views",
    "train.micro_batch_size",
    "train.use_gpu",
    "run.storage_path",
    "run.run_name",
    "run.tracker",
    "run.object_store_gb",
    "run.verbose",
)
_AUTOMATIC_NAME = (
    "# run_name: null = a new dated folder for every run of this file (set one to name the folder)\n"
)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: its attribute docstring}`` of a dataclass, read from the string right under each field."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # dedent: a nested class
    return {
        node.target.id: after.value.value.strip()
        for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }


class _Parser(argparse.ArgumentParser):
    """argparse without prefix matching (``--epoch 3`` would silently set ``--epochs``), and an unknown
    flag refused with the closest known one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)
        self.flags: list[str] = ["--help"]  # the listed flags, for the "did you mean" of an unknown one

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            first = next((e for e in extras if e.startswith("-")), extras[0])
            field = first.split("=", 1)[0].lstrip("-").rsplit(".", 1)[-1].replace("-", "_")
            if field.startswith("no_") and field[3:] in RETIRED:
                field = field[3:]
            if field in RETIRED:
                self.error(f"{first} was retired with Ray Train: {RETIRED[field][0]}; drop it")
            close = difflib.get_close_matches(first.split("=", 1)[0], self.flags, n=1)
            hint = f": did you mean {close[0]}?" if close else ""
            what = "flag" if first.startswith("-") else "argument"
            self.error(f"unknown {what} {first!r}{hint} (--help lists the flags)")
        return parsed


class _Switch(argparse.Action):
    """A boolean flag and its negation: ``--resume``/``--no-resume``, ``--run.resume``/``--run.no_resume``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        negated = [_negate(s) for s in option_strings if s.startswith("--")]
        super().__init__([*option_strings, *negated], dest, nargs=0, **kwargs)
        self.negated = frozenset(negated)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, option_string not in self.negated)


def _negate(flag: str) -> str:
    section, dot, name = flag[2:].rpartition(".")
    return f"--{section}.no_{name}" if dot else f"--no-{name}"


def _members(annotation: Any) -> tuple[list[Any], bool]:
    """(the types of a union without None, whether None is one of them); a plain type is its own member."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return [annotation], False
    args = typing.get_args(annotation)
    return [m for m in args if m is not type(None)], type(None) in args


def _is_fixed_tuple(annotation: Any) -> bool:
    """``tuple[str, str]``-like: a fixed number of items of one of int, float or str (one flag, nargs N)."""
    items = typing.get_args(annotation)
    return typing.get_origin(annotation) is tuple and len(set(items)) == 1 and items[0] in (int, float, str)


def _converter(annotation: Any) -> Callable[[str], Any]:
    """Text -> the annotated scalar type: int, float or str members tried in that order; "none" -> None."""
    members, optional = _members(annotation)
    # A tuple member (learners "2:8") stays text: the config parses its own MIN:MAX form.
    keeps_text = str in members or any(typing.get_origin(m) is tuple for m in members)
    wanted = " or ".join(m.__name__ for m in (int, float) if m in members) or "text"

    def convert(text: str) -> Any:
        if optional and text.strip().lower() == "none":
            return None
        for kind in (int, float):
            if kind in members:
                try:
                    return kind(text)
                except ValueError:
                    pass
        if keeps_text:
            return text
        hint = ""
        if int in members:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number.is_integer():  # "1e9": a whole number in float notation
                hint = f": write it as {int(number)}"
        raise argparse.ArgumentTypeError(
            f"expected {wanted}{' or none' if optional else ''}, got {text!r}{hint}"
        )

    return convert


def _add_field(group, section: str, f: dataclasses.Field, annotation: Any, doc: str) -> list[str]:
    """The kebab flag (listed in --help) and the dotted one (same dest, not listed) of one field; returns
    the listed spellings."""
    kebab = [*([_SHORT[f.name]] if f.name in _SHORT else []), f"--{f.name.replace('_', '-')}"]
    dotted = [f"--{section}.{f.name}"]
    members, _ = _members(annotation)
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    # argparse %-formats help, and a docstring may say "10 %".
    text = f"{doc} [default {default}]".replace("%", "%%")
    dest = f"{section}.{f.name}"
    scalar = all(m in (int, float, str) or _is_fixed_tuple(m) for m in members)
    if members != [bool] and not scalar:
        # A programmer's error, found when the parser is built rather than when someone passes the flag.
        raise TypeError(
            f"{dest}: the annotation {annotation} has no command-line form: use int, float, str, bool, "
            "a tuple, unions of those or X | None, or teach raytrain_seq/cli.py the new type"
        )
    if members == [bool]:
        options: dict[str, Any] = {"action": _Switch}
    elif len(members) == 1 and typing.get_origin(members[0]) is tuple:
        items = typing.get_args(members[0])
        metavar = _METAVARS.get(f.name, tuple(f"{f.name.upper()}_{i}" for i in range(len(items))))
        options = {"nargs": len(items), "type": _converter(items[0]), "metavar": metavar}
    else:
        options = {"type": _converter(annotation), "metavar": _METAVARS.get(f.name, f.name.upper())}
    listed = group.add_argument(*kebab, dest=dest, help=text, **options)
    group.add_argument(*dotted, dest=dest, help=argparse.SUPPRESS, **options)
    return list(listed.option_strings)


def build_parser(
    prog: str | None = None,
    description: str | None = None,
    *,
    fields: tuple[str, ...] | None = None,
    usage: str | None = None,
) -> argparse.ArgumentParser:
    """Every field (or only ``fields``, dotted names) as a flag: the user's flags grouped by section, the
    ``ADVANCED`` ones last in one group; plus --preset, --config, --print-config."""
    parser = _Parser(
        prog=prog,
        description=" ".join(
            [
                *([description] if description else []),
                "Values: the defaults < --preset < --config FILE < the flags given. Every flag also takes "
                "its dotted form (--data.crop for --crop); --no-X turns a switch off; 'none' unsets an "
                "optional value.",
            ]
        ),
        usage=usage or "%(prog)s [--preset NAME] [--config FILE] [--print-config] [--FLAG VALUE ...]",
        # Absent flags stay absent from the namespace, so the file, preset or default value is kept.
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="start from a named configuration; --config and flags override it",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML or JSON file laid out like --print-config's output; overrides --preset, flags override it",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        default=False,
        help="print the resolved configuration as YAML and exit without running anything",
    )
    parser.flags += ["--preset", "--config", "--print-config"]
    advanced = []
    for section, cls in SECTIONS.items():
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        chosen = [f for f in dataclasses.fields(cls) if fields is None or f"{section}.{f.name}" in fields]
        if any(f"{section}.{f.name}" not in ADVANCED for f in chosen):
            group = parser.add_argument_group(section, inspect.getdoc(cls).splitlines()[0])
        for f in chosen:
            if f"{section}.{f.name}" in ADVANCED:
                advanced.append((section, f, hints[f.name], docs[f.name]))
            else:
                parser.flags += _add_field(group, section, f, hints[f.name], docs[f.name])
    if advanced:
        group = parser.add_argument_group(
            "advanced",
            "the runtime's tuning knobs (fault tolerance, averaging transport, memory): the "
            "defaults suit most runs",
        )
        for section, f, annotation, doc in advanced:
            parser.flags += _add_field(group, section, f, annotation, doc)
    return parser


class _DuplicateKey(ValueError):
    """A key given twice in one mapping of a config file (YAML and JSON would keep the last silently)."""


@functools.cache
def _yaml_loader() -> type:
    # PyYAML follows YAML 1.1, where a float needs a dot ("1e-3" would load as the string '1e-3');
    # people write learning rates that way, so read the exponent form as a float too.
    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    seen = key in first
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if seen:
                    raise _DuplicateKey(
                        f"key {key!r} is given twice (lines {first[key]} and {key_node.start_mark.line + 1}), "
                        "and only the last would count: merge the two into one"
                    )
                first[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader


def load_config_file(path: str) -> dict[str, dict[str, Any]]:
    """The sections of a --config file; ValueError (one line naming the file, the key and the fix) if bad."""
    where = f"--config {path}"
    file = Path(path).expanduser()
    if file.suffix.lower() not in _CONFIG_SUFFIXES:
        raise ValueError(f"{where}: unknown format {file.suffix!r}: give a .yaml, .yml or .json file")
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or err
        raise ValueError(
            f"{where}: cannot read it ({reason}): give the path of an existing file "
            "(write one with --print-config > FILE)"
        ) from None
    try:
        # _yaml_loader() is a SafeLoader: it builds plain data only, never objects.
        if file.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_json_object)
        else:
            data = yaml.load(text, Loader=_yaml_loader())
    except _DuplicateKey as err:
        raise ValueError(f"{where}: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{where}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): fix the syntax"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ValueError(f"{where}: not valid YAML ({problem}{at}): fix the syntax") from None
    if data is None:  # an empty file: nothing to override
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{where}: expected a mapping of sections ({', '.join(SECTIONS)}), got a {type(data).__name__}: "
            "lay it out like --print-config's output"
        )
    owners = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    unknown = []
    for section, values in data.items():
        if section not in SECTIONS:
            # A flat file (``epochs: 3`` at the top, as MMAction writes them) gets its section named.
            unknown.append(_hint(str(section), list(SECTIONS), None, owners))
        elif not isinstance(values, dict):
            raise ValueError(
                f"{where}: section {section!r} must map field names to values, got {values!r}: "
                "lay it out like --print-config's output"
            )
        else:
            known = [f.name for f in dataclasses.fields(SECTIONS[section])]
            unknown += [
                _hint(f"{section}.{key}", known, section, owners)
                for key in values
                if key not in known and not (section == "train" and key in RETIRED)  # Config.from_dict's
            ]
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(unknown)}: use the section.field names --print-config writes"
        )
    return data


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json.loads would keep the last one)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(
                f"key {key!r} is given twice in one object, and only the last would count: merge the two"
            )
        out[key] = value
    return out


def _hint(
    key: str, known: list[str], section: str | None = None, owners: dict[str, str] | None = None
) -> str:
    """``key`` quoted, with where it belongs (a field of another section) or the closest known name."""
    name = key.rsplit(".", 1)[-1]
    if owners and name in owners:
        if section is None:  # a field at the top of the file
            return f"{key!r} (it belongs in {owners[name]!r}: write {owners[name]}: {{{name}: ...}})"
        return f"{key!r} (it belongs in {owners[name]!r}: {owners[name]}.{name})"
    close = difflib.get_close_matches(name, known, n=1)
    if not close:
        return repr(key)
    return f"{key!r} (did you mean {(f'{section}.' if section else '') + close[0]!r}?)"


def _layers(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The --config file's sections with the flags given on top (the preset is applied below them)."""
    sections = load_config_file(args.config) if getattr(args, "config", None) else {}
    sections = {name: dict(values) for name, values in sections.items()}
    for dest, value in vars(args).items():
        if "." in dest:  # field flags have the dest "section.field"; the job's own options have none
            section, name = dest.split(".")
            sections.setdefault(section, {})[name] = tuple(value) if isinstance(value, list) else value
    return sections


def config_from_args(args: argparse.Namespace) -> Config:
    """Defaults < --preset < --config FILE < flags given; ValueError naming the field (or file) if invalid."""
    return Config.from_preset(getattr(args, "preset", None), **_layers(args))


def parse(
    argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> tuple[Config, argparse.Namespace]:
    """(the resolved Config, the namespace with preset/config/print_config/verbose); ValueError if invalid.

    A flag argparse cannot read at all exits 2 (SystemExit), as argparse does.
    """
    args = (parser or build_parser()).parse_args(argv)
    return config_from_args(args), args


def config_yaml(config: Config, *, automatic_name: bool = False) -> str:
    """The Config as the YAML ``--config`` reads back (tuples become lists, which the Config accepts).

    ``automatic_name``: the run_name came from the clock, not from the user; it is written as ``null``, so
    that running the file again makes a new dated folder instead of stopping on this run's folder.
    """
    plain = json.loads(json.dumps(config.to_dict()))
    if automatic_name:
        plain["run"]["run_name"] = None
    text = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)
    return _AUTOMATIC_NAME + text if automatic_name else text


def run_job(config: Config, runner: Callable[[Config], RunSummary]) -> int:
    """Check the paths, run, print the result table and last ``summary written to PATH``; 2 if the run
    cannot start here (a path, the run folder, the cluster)."""
    config = config.named()  # the folder the checks below, the run and its summary share
    logger.info("run %s -> %s", config.run.run_name, config.run_dir())
    try:
        preflight.check(config)  # before the runner imports ray: a wrong input costs seconds, not a cluster
        summary = runner(config)
    except RunSetupError as err:
        # Nothing has trained yet (run folder, cluster size, resume point): one line with the fix.
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(summary))
    print(f"summary written to {summary.json_path}")
    return 0


def main(
    argv: list[str] | None,
    runner: Callable[[Config], RunSummary],
    parser: argparse.ArgumentParser | None = None,
) -> int:
    """A job's whole main: parse, set up logging, then print the config or run it; returns the exit code."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    try:
        sections = _layers(args)
        config = Config.from_preset(getattr(args, "preset", None), **sections)
    except ValueError as err:
        # A bad value is the user's to fix: one line naming the field, no traceback (argparse style).
        print(f"error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if config.run.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.print_config:
        print(config_yaml(config, automatic_name=config.run.run_name is None), end="")
        return 0
    return run_job(config, runner)
