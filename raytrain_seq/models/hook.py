"""The model hook: ``--model-factory package.module:function`` names the per-sequence encoder of a run.

Contract: ``function`` is imported on every process that builds the model (the preflight check, each
learner, the evaluator, predict), so its module must be importable there: inside the folder
``ray job submit --working-dir`` ships, or installed. It is called as ``function(in_channels=C)`` when
it takes an ``in_channels`` parameter (3 for RGB, 2 for a flow stream), else with no argument, and
returns a ``torch.nn.Module`` with an int ``out_dim`` whose ``forward(frames)`` maps one sequence,
float ``[T, C, H, W]`` (already normalised: ``x / 255 - 0.5``), to its features ``[out_dim]``; it may
define ``forward_packed(x [N, C, H, W], lengths [K]) -> [K, out_dim]`` to take every sequence of a batch
in one call (``models.sequence``). ``SequenceClassifier`` puts a linear head on it; packing, averaging,
refurbishing and micro-batch streaming see an ordinary model. A layer that couples the samples of a
batch (BatchNorm in training mode) breaks the exact micro-batch gradient, as in any model
(``microbatch`` warns about it). docs/ARCHITECTURE.md has a 20-line example.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable

from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["FACTORY_PATTERN", "build_from_factory", "resolve_factory"]

# package.module:function (dotted names both sides: "mypkg.models:Builder.create" is allowed).
FACTORY_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def resolve_factory(spec: str) -> Callable[..., nn.Module]:
    """The callable ``spec`` ("package.module:function") names; ValueError naming it and the fix."""
    if not isinstance(spec, str) or not FACTORY_PATTERN.match(spec):
        raise ValueError(
            f"--model-factory {spec!r}: expected 'package.module:function' (e.g. mymodels.video:build)"
        )
    module_name, attribute = spec.split(":")
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"--model-factory {spec}: cannot import {module_name} ({exc}): put the module in the job's "
            "working directory or install it on every node"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"--model-factory {spec}: {module_name} has no {attribute}: check the name")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"--model-factory {spec}: {attribute} is a {type(target).__name__}, not a function")
    return target


def _takes_in_channels(function: Callable[..., nn.Module]) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: call it plainly
        return False
    return any(p.name == "in_channels" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def build_from_factory(spec: str, in_channels: int) -> nn.Module:
    """``function(in_channels=C)`` (or ``function()``) of ``spec``, checked to be a module with ``out_dim``."""
    function = resolve_factory(spec)
    module = function(in_channels=in_channels) if _takes_in_channels(function) else function()
    if not isinstance(module, nn.Module):
        raise ValueError(
            f"--model-factory {spec}: returned a {type(module).__name__}, not a torch.nn.Module: return the "
            "per-sequence encoder module"
        )
    out_dim = getattr(module, "out_dim", None)
    if isinstance(out_dim, bool) or not isinstance(out_dim, int) or out_dim < 1:
        raise ValueError(
            f"--model-factory {spec}: the module has no positive int out_dim ({out_dim!r}): set "
            "self.out_dim = D, the size of the feature vector it returns per sequence"
        )
    logger.info("model factory %s: %s, out_dim=%d", spec, type(module).__name__, out_dim)
    return module
