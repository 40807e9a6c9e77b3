"""The choice tables and bounds of the run's config tree (``raytrain_seq.config``): the values each choice
field takes and the limits its checks hold. The tree imports no torch and no folder that imports it, so a
table owned by torch code or by ``data/`` is copied here and a test holds the two equal.
"""

from __future__ import annotations

from raytrain_seq.algorithms.augment import TEST_VIEWS
from raytrain_seq.algorithms.packing import STRATEGIES

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
    "REAL_DATASETS",
    "STREAMS",
    "SYNTHETIC_CLASSES",
    "TEMPORALS",
    "TEST_VIEWS",
    "TRACKERS",
    "VALIDATORS",
    "VIDEO_BACKBONES",
]

DATASETS: tuple[str, ...] = ("synthetic", "ucf101", "hmdb51", "list")
REAL_DATASETS: tuple[str, ...] = ("ucf101", "hmdb51", "list")
LIST_FIELDS: tuple[str, ...] = ("train_list", "test_list", "val_list", "class_names")
STREAMS: tuple[str, ...] = ("rgb", "flow", "fuse")
FRAME_BACKBONES: tuple[str, ...] = ("small", "resnet18", "resnet50", "resnet152")
# torchvision's video ResNets (models/video.py, VIDEO_ARCHS; tests/test_video_backbones.py holds the two
# equal: config imports no torch).
VIDEO_BACKBONES: tuple[str, ...] = ("r2plus1d_18", "r3d_18", "mc3_18")
BACKBONES: tuple[str, ...] = FRAME_BACKBONES + VIDEO_BACKBONES
# package.module:function (models/hook.py, FACTORY_PATTERN, the same pattern).
FACTORY_FORMAT = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
TEMPORALS: tuple[str, ...] = ("gru", "tcn")
NORMS: tuple[str, ...] = ("auto", "batchnorm")  # models.factory.MODEL_NORMS (config imports no torch)
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw", "sgd")
TRACKERS: tuple[str, ...] = ("tensorboard", "mlflow", "none")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")
VALIDATORS: tuple[str, ...] = ("auto", "learners", "evaluator")
PACKINGS: tuple[str, ...] = STRATEGIES
BATCH_GROWTH: tuple[str, ...] = ("steps", "always")  # averaging.BATCH_GROWTH (config imports no torch)
BATCH_RULES: tuple[str, ...] = ("noise-aware", "paper")  # averaging.BATCH_RULES
# data/decoders.py's DECODERS: data/ imports config/, so config/ keeps its own copy (tests/test_config.py
# holds the two equal).
DECODERS: tuple[str, ...] = ("auto", "pyav", "opencv", "decord")
PAPER_B1 = 1.0  # AAVG's b1 (Cong et al.: "we simply use b1=1 and b2=2", B up to 576)
# Classes of the synthetic set: ordered pairs of its 12 motions, 12 x 11 (data/synthetic.py, class_motions;
# tests/test_synthetic.py holds the two equal).
SYNTHETIC_CLASSES = 132
# A bound on the parameters a config may ask for (1 GB of fp32 weights, 3 GB with Adam's moments): far
# above every model this project trains (a ResNet-152 has 60 M), low enough that a typo such as
# --depth 12 (about 5e9 parameters) stops here instead of allocating for minutes.
MAX_PARAMETERS = 250_000_000
