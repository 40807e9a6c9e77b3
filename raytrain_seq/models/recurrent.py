"""Recurrent modules' weights kept in one chunk of memory, the layout cuDNN reads them from.

cuDNN runs an RNN from one weight buffer. ``nn.RNNBase.flatten_parameters`` copies a module's weights into
such a buffer and makes each parameter a view of it; a weight that is anywhere else (a view of the
averaging round's flat buffers, ``dataplane.flat_storage``) makes every forward copy the weights into a
fresh buffer and warn ("RNN module weights are not part of single contiguous chunk of memory").
``recurrent_keys`` names the state-dict keys of a model's recurrent weights, which the flat storage
therefore mirrors instead of binding; ``compact_recurrent`` puts each module's weights back into one
chunk: cuDNN's own on CUDA (``flatten_parameters``), elsewhere one contiguous buffer in the module's
parameter order (no kernel needs it there, but the learner's invariant, one chunk per module and no
weight inside the round's buffers, then holds and is checked the same way on every device).
``is_compact`` checks that invariant. Plain torch.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["compact_recurrent", "is_compact", "recurrent_keys"]


def _recurrent(model: nn.Module) -> list[tuple[str, nn.RNNBase]]:
    return [(name, module) for name, module in model.named_modules() if isinstance(module, nn.RNNBase)]


def _weights(module: nn.RNNBase) -> list[nn.Parameter]:
    return [weight for layer in module.all_weights for weight in layer]


def recurrent_keys(model: nn.Module) -> frozenset[str]:
    """The state-dict keys of every recurrent module's weights: ``temporal.gru.weight_ih_l0``, ..."""
    return frozenset(
        f"{name}.{key}" if name else key
        for name, module in _recurrent(model)
        for key, _ in module.named_parameters(recurse=False)
    )


def compact_recurrent(model: nn.Module) -> int:
    """Put each recurrent module's weights into one chunk (values unchanged); returns the modules done.

    On CUDA this is ``flatten_parameters`` (cuDNN's layout). On a CPU the weights are copied into one
    contiguous buffer in ``all_weights`` order, unless they already lie so."""
    done = 0
    for _, module in _recurrent(model):
        weights = _weights(module)
        if not weights:
            continue
        if weights[0].is_cuda:
            module.flatten_parameters()
        elif not is_compact(module):
            with torch.no_grad():
                chunk = torch.empty(sum(w.numel() for w in weights), dtype=weights[0].dtype)
                offset = 0
                for weight in weights:
                    view = chunk[offset : offset + weight.numel()].view_as(weight)
                    view.copy_(weight)
                    weight.data = view  # the parameter object stays: the optimizer keeps its state
                    offset += weight.numel()
        done += 1
    return done


def is_compact(module: nn.RNNBase) -> bool:
    """Whether the module's weights share one storage, laid out in ``all_weights`` order without overlap
    (cuDNN may pad between them: a gap is allowed, an overlap or another storage is not)."""
    weights = _weights(module)
    if not weights:
        return True
    storage = weights[0].untyped_storage().data_ptr()
    end = None
    for weight in weights:
        if weight.untyped_storage().data_ptr() != storage or not weight.is_contiguous():
            return False
        start = weight.data_ptr()
        if end is not None and start < end:
            return False
        end = start + weight.numel() * weight.element_size()
    return True
