"""Named runs: overrides of the config defaults that ``Config.from_preset`` and ``--preset`` apply.

Plain data (no imports of the config), so a preset reads as the flags it stands for: each maps a config
section ("data", "model", "train", "run") to the fields it changes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

# Only overrides of the defaults in raytrain_seq.config; the lead tunes the numbers here.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # ~1 minute end to end with 2 learners on 2 CPU cores: few tiny videos, a tiny model, 2 epochs.
    "smoke": {
        "data": {"num_classes": 4, "max_videos": 120, "cache_size": 20, "crop": 16},
        "model": {"width": 8, "depth": 2, "hidden": 32},
        "train": {"learners": 2, "epochs": 2, "batch_size": 4, "micro_batch_size": 4},
    },
    # `make demo`: >= 90 % test accuracy on the synthetic set with 2 learners in <= 6 minutes on 2 cores.
    # Measured on the 2-core box (`make demo`, nothing else running): 95.5 % test accuracy, 0.21 %
    # padding, 319 s for the whole job, 157 s of it compute per learner.
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
}
