"""raytrain_seq: elastic training on Ray for models that learn from whole variable-length sequences.

The algorithm modules (``algorithms/``: ``packing``, ``microbatch``, ``averaging``, ``batchsize``,
``refurbish``) are pure (numpy/torch only) and import neither ray nor each other; the other folders
hold one concept each, and ``raytrain_seq.runtime`` is the only package that imports ray.
docs/ARCHITECTURE.md ("Layout") maps the folders and the contracts.

The Python API (README, "From Python")::

    from raytrain_seq import Config, train
    summary = train(Config.from_preset("smoke", epochs=1))

``Config`` and ``train`` are loaded on first use, so importing this package starts and imports nothing.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Config", "train"]


def __getattr__(name: str) -> Any:
    # PEP 562: `from raytrain_seq import train` imports the driver only when asked for it.
    if name == "Config":
        from raytrain_seq.config import Config

        return Config
    raise AttributeError(f"module 'raytrain_seq' has no attribute {name!r}")


def train(config: Any, **kwargs: Any) -> Any:
    """Train as ``config`` (a ``Config``) says and return the ``RunSummary`` (also in ``run_dir``).

    ``runtime.driver.run``: the paths are checked first, then it connects to Ray (``RAY_ADDRESS``, a local
    ``ray start``, or a Ray of its own) and trains; ``kwargs`` go to ``run``.
    """
    from raytrain_seq.runtime.driver import run

    return run(config, **kwargs)
