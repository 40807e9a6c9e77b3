"""The run's config tree itself (``raytrain_seq.config``): ``Config``, its four sections, and their plain form.

``to_dict``/``from_dict`` give and rebuild nested plain types (workers, checkpoints, summary.json; a
``RETIRED`` field at its old default in a record is dropped, any other use refused), ``from_preset`` lays
overrides over a preset, ``named`` names the run folder and ``run_dir`` finds it. ``RunSetupError`` is a
valid config that cannot start here.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from raytrain_seq.config.data import DataConfig
from raytrain_seq.config.model import ModelConfig
from raytrain_seq.config.run import RunConfig
from raytrain_seq.config.train import TrainConfig
from raytrain_seq.presets import PRESETS

logger = logging.getLogger(__name__)

__all__ = ["RETIRED", "Config", "RunSetupError"]


class RunSetupError(ValueError):
    """A valid configuration that cannot start here (run folder, cluster size, resume point).

    Raised before any training, so the job reports it as one line naming the fix, like a bad flag.
    """


_SECTIONS: dict[str, type] = dict(data=DataConfig, model=ModelConfig, train=TrainConfig, run=RunConfig)
# Field names are unique across sections (they are the flag names), so a flat override finds its section.
_FIELD_SECTION: dict[str, str] = {f.name: s for s, c in _SECTIONS.items() for f in dataclasses.fields(c)}


# Fields only Ray Train read (runtime/fleet.py): what replaced each, and the default older records hold.
RETIRED: dict[str, tuple[str, Any]] = {
    "resize_interval_s": ("a learner slot joins as soon as a node has room for it", 60.0),
    "preemption_watcher": ("a drained node's learners are lost learners, restarted in their slots", False),
}


def _retired(key: str, value: Any, *, record: bool = True) -> bool:
    """True for a retired field at its old default in a record; ValueError for any other use of one."""
    if key not in RETIRED:
        return False
    if record and value == RETIRED[key][1]:
        return True
    raise ValueError(f"train.{key} was retired with Ray Train: {RETIRED[key][0]}; drop it (got {value!r})")


def _unknown(keys: list[str], known: list[str], where: str) -> ValueError:
    hints = []
    for key in keys:
        name = str(key).rsplit(".", 1)[-1]
        if name in _FIELD_SECTION and name not in known:  # a field of a section, given at another level
            owner = _FIELD_SECTION[name]
            hints.append(f"{key!r} (it belongs in {owner!r}: {owner}: {{{name}: ...}})")
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ValueError(f"unknown {where} key(s) {', '.join(hints)}: valid keys are {', '.join(known)}")


@dataclass(kw_only=True)
class Config:
    """A whole run: ``Config(data=DataConfig(...), model=..., train=..., run=...)``."""

    data: DataConfig = field(default_factory=DataConfig)
    """Videos, striding, augmentation cache, refurbishing and packing."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The temporal classifier."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """AAVG learners, averaging rounds, adaptive batch size and optimizer."""
    run: RunConfig = field(default_factory=RunConfig)
    """Output folder and resume."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"Config.{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}: "
                    f"pass {name}={cls.__name__}(...) or build the whole tree with Config.from_dict"
                )
        if (self.data.stream == "fuse") != (self.model.fuse is not None):
            raise ValueError(
                "data.stream='fuse' and model.fuse go together: pass --stream fuse --fuse RGB_RUN FLOW_RUN "
                f"(got stream={self.data.stream!r}, fuse={self.model.fuse!r})"
            )
        if self.run.resume and self.run.run_name is None:
            raise ValueError(
                "run.resume=True needs run.run_name: pass the name of the run to resume (--run-name NAME)"
            )
        self.validate()

    def validate(self) -> None:
        """Re-check every section (after a field was changed in place); raises ValueError naming it."""
        for name in _SECTIONS:
            getattr(self, name).validate()

    def named(self) -> Config:
        """This config with its run folder named: itself when ``run.run_name`` is set, else a copy named
        ``ucf101-<dataset>-<UTC stamp>``. The driver (and the job, before its checks) calls it once, so every
        copy it hands on (learners, checkpoints, summary.json) names the same folder."""
        if self.run.run_name is not None:
            return self
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        run = dataclasses.replace(self.run, run_name=f"ucf101-{self.data.dataset}-{stamp}")
        return dataclasses.replace(self, run=run)

    def run_dir(self) -> Path:
        """``storage_path / run_name`` with ``~`` expanded: the folder of checkpoints and summary.json."""
        if self.run.run_name is None:
            raise ValueError(
                "run.run_name is not set, so the run has no folder yet: pass --run-name NAME, or call "
                "Config.named() first (the driver does when a run starts)"
            )
        return Path(os.path.expanduser(self.run.storage_path)) / self.run.run_name

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain types (str, int, float, bool, None): JSON-able, ``from_dict`` rebuilds it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        """Rebuild from ``to_dict()`` output; missing keys take defaults, unknown keys raise ValueError."""
        if not isinstance(d, Mapping):
            raise ValueError(
                f"a config must map sections ({', '.join(_SECTIONS)}) to their fields, got a "
                f"{type(d).__name__}: lay it out like --print-config's output"
            )
        unknown = sorted(str(k) for k in set(d) - set(_SECTIONS))
        if unknown:
            raise _unknown(unknown, list(_SECTIONS), "config section")
        sections = {}
        for name, section_cls in _SECTIONS.items():
            values = d.get(name, {})
            if not isinstance(values, Mapping):
                raise ValueError(
                    f"config section {name!r} must map field names to values, got {values!r}: "
                    f"write it like {name}: {{field: value}}"
                )
            known = [f.name for f in dataclasses.fields(section_cls)]
            values = {k: v for k, v in values.items() if not (name == "train" and _retired(k, v))}
            unknown = sorted(f"{name}.{k}" for k in set(values) - set(known))
            if unknown:
                raise _unknown(unknown, known, f"{name}")
            sections[name] = section_cls(**values)
        return cls(**sections)

    @classmethod
    def from_preset(cls, name: str | None, **overrides: Any) -> Config:
        """The preset ``name`` (a key of PRESETS; None = the defaults) with ``overrides`` applied on top.

        An override is a field name (``epochs=3``, the flag names with ``-`` -> ``_``) or a whole
        section (``train={"epochs": 3}``); unknown names raise ValueError.
        """
        if name is not None and name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(sorted(PRESETS))}, or None")
        merged: dict[str, dict[str, Any]] = {
            section: dict(values) for section, values in (PRESETS[name] if name else {}).items()
        }
        for key, value in overrides.items():
            if key in _SECTIONS and isinstance(value, Mapping):
                merged.setdefault(key, {}).update(value)
            elif key in _FIELD_SECTION:
                merged.setdefault(_FIELD_SECTION[key], {})[key] = value
            elif key in RETIRED:
                _retired(key, value, record=False)
            else:
                raise _unknown([key], sorted(_FIELD_SECTION), "override")
        logger.debug("config from preset %s with overrides %s", name, sorted(overrides))
        return cls.from_dict(merged)
