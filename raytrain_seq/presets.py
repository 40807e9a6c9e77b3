"""Named runs: overrides of the config defaults that ``Config.from_preset`` and ``--preset`` apply.

Plain data (no imports of the config), so a preset reads as the flags it stands for: each maps a config
section ("data", "model", "train", "run") to the fields it changes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

# UCF101 split 1 from the official archives extracted to ~/data/UCF101 (or --data-root DIR) with
# ResNet-50 frame encoders on GPUs. Stride 8 keeps ~24 frames of the median 7 s clip (mean 23.8; the
# longest, 222, sets t_max), a 128-pixel cache and 112-pixel crops; batches of 8 blocks (about 9 clips
# each), micro-batches sized to the GPU. Under these epochs B stays at 8 (train.batch_growth "steps"; the
# run says so at start): --steps N gives AAVG's Algorithm 1 its budget to grow B up to 64. --weights
# FILE (a torchvision resnet50 ImageNet state_dict) starts the RGB stream from ImageNet.
_UCF101_GPU: dict[str, dict[str, Any]] = {
    "data": {"dataset": "ucf101", "data_root": "~/data/UCF101", "stride": 8, "cache_size": 128, "crop": 112},
    "model": {"backbone": "resnet50", "hidden": 512},
    "train": {
        "learners": 4,
        "epochs": 30,
        "batch_size": 8,
        "max_batch_size": 64,
        "micro_batch_size": "auto",
        "lr": 1e-4,
        "checkpoint_every": 5,
    },
}

# Only overrides of the defaults in raytrain_seq.config; the lead tunes the numbers here.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The quickest end-to-end run with 2 learners on 2 CPU cores: few tiny videos, a tiny model, 2 epochs.
    "smoke": {
        "data": {"num_classes": 4, "max_videos": 120, "cache_size": 20, "crop": 16},
        "model": {"width": 8, "depth": 2, "hidden": 32},
        "train": {"learners": 2, "epochs": 2, "batch_size": 4, "micro_batch_size": 4},
    },
    # `make demo`: >= 90 % test accuracy on the synthetic set with 2 learners in <= 6 minutes on 2 cores
    # (the target; README's "The demo, measured" has the runs that check it).
    "demo": {
        "data": {"num_classes": 10, "max_videos": 3000, "cache_size": 36, "crop": 32},
        "model": {"width": 16, "depth": 3, "hidden": 64},
        "train": {
            "learners": 2,
            "epochs": 10,
            "batch_size": 4,
            "micro_batch_size": 4,
            "lr": 3e-3,
            "checkpoint_every": 5,
        },
    },
    # Real video on a GPU cluster (README, "Real video"): the two streams of one two-stream model.
    "ucf101-rgb": {**_UCF101_GPU, "data": {**_UCF101_GPU["data"], "stream": "rgb"}},
    # The flow stream: pass --init-from RGB_RUN_DIR (cross-modality initialisation from the RGB run).
    "ucf101-flow": {**_UCF101_GPU, "data": {**_UCF101_GPU["data"], "stream": "flow"}},
    # A miniature dataset on a laptop CPU (README's miniature commands, tests/test_real_video.py): tiny
    # frames and model, one learner, 4 epochs; pass --dataset ucf101|hmdb51 --data-root DIR.
    "mini-video": {
        "data": {"stride": 2, "cache_size": 20, "crop": 16},
        "model": {"width": 8, "depth": 2, "hidden": 16},
        "train": {"learners": 1, "epochs": 4, "batch_size": 4, "micro_batch_size": 4, "lr": 1e-2},
    },
}
