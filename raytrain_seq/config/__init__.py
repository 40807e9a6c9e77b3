"""One dataclass tree for a whole run: ``Config(data=..., model=..., train=..., run=...)``, a module per
section (``data``, ``model``, ``train``, ``run``), the choice tables in ``choices`` and the tree itself in
``tree``. The four techniques (docs/ARCHITECTURE.md) meet here as settings, so one value travels to every
process: BLoad packing (``data.packing``, ``data.t_max``), AAVG averaging (``train.k``,
``train.validate_every`` = m, ``train.b1``/``b2``, ``train.max_batch_size``, ``train.batch_growth``),
Revamper refurbishing (``data.reuse`` = r) and micro-batch streaming (``train.micro_batch_size``).
``raytrain_seq.cli`` makes every field a flag ``--section.field`` and ``--field-name`` whose help is its
one-line docstring. Every value is checked once, at construction (``__post_init__``): a bad one raises
ValueError naming the field, the value and the fix, before Ray starts; after changing a field of the
(mutable) tree, call ``validate()``. ``to_dict`` and ``from_dict`` give nested plain types for workers,
checkpoints and summary.json. Importing the package builds nothing and imports no torch.
"""

from raytrain_seq.config.choices import (
    BACKBONES,
    BATCH_GROWTH,
    BATCH_RULES,
    DATASETS,
    DECODERS,
    FACTORY_FORMAT,
    FRAME_BACKBONES,
    LIST_FIELDS,
    LR_SCHEDULES,
    MAX_PARAMETERS,
    NORMS,
    OPTIMIZERS,
    PACKINGS,
    PAPER_B1,
    PRECISIONS,
    REAL_DATASETS,
    STREAMS,
    SYNTHETIC_CLASSES,
    TEMPORALS,
    TEST_VIEWS,
    TRACKERS,
    VALIDATORS,
    VIDEO_BACKBONES,
)
from raytrain_seq.config.data import DataConfig
from raytrain_seq.config.model import ModelConfig
from raytrain_seq.config.run import RunConfig
from raytrain_seq.config.train import TrainConfig
from raytrain_seq.config.tree import RETIRED, Config, RunSetupError
from raytrain_seq.presets import PRESETS

__all__ = [
    "BACKBONES",
    "BATCH_GROWTH",
    "BATCH_RULES",
    "DATASETS",
    "DECODERS",
    "FACTORY_FORMAT",
    "FRAME_BACKBONES",
    "LIST_FIELDS",
    "LR_SCHEDULES",
    "MAX_PARAMETERS",
    "NORMS",
    "OPTIMIZERS",
    "PACKINGS",
    "PAPER_B1",
    "PRECISIONS",
    "PRESETS",
    "REAL_DATASETS",
    "RETIRED",
    "STREAMS",
    "SYNTHETIC_CLASSES",
    "TEMPORALS",
    "TEST_VIEWS",
    "TRACKERS",
    "VALIDATORS",
    "VIDEO_BACKBONES",
    "Config",
    "DataConfig",
    "ModelConfig",
    "RunConfig",
    "RunSetupError",
    "TrainConfig",
]
