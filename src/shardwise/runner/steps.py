"""One step of the Runner: the model's own ``train_step``/``val_step``/``test_step`` when it
has them (mmengine's ``BaseModel``), else the default step: the batch moved to the device, the
model called with it (``model(*batch)`` for a tuple or list, ``model(**batch)`` for a dict),
and, in training, the sum of the returned entries whose key contains ``'loss'``
back-propagated (:func:`parse_losses`). The logged values are averaged over the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from shardwise import dist
from shardwise.optim import OptimWrapperDict
from shardwise.strategies.matching import unwrap_model

__all__ = ["eval_step", "parse_losses", "train_step"]


def train_step(
    model: nn.Module, optim_wrapper: Any, data: Any, device: torch.device, pipeline: Any = None
) -> dict[str, torch.Tensor]:
    """One optimisation step on ``data``; returns the logged values (``loss``...), averaged
    over ranks, as 0-dim tensors. A model split into pipeline stages runs the ``pipeline``'s
    schedule (:meth:`~shardwise.strategies.pipeline.Pipeline.train_step`)."""
    own = own_method(model, "train_step")
    if pipeline is not None:
        log_vars = pipeline.train_step(data, optim_wrapper)
    elif own is not None:
        log_vars = check_log_vars(own(data, optim_wrapper=optim_wrapper))
    else:
        if isinstance(optim_wrapper, OptimWrapperDict):
            raise TypeError(
                "the default train step updates one optimizer, but optim_wrapper holds "
                f"several ({sorted(optim_wrapper.keys())}); define "
                "train_step(data, optim_wrapper) on the model to update them"
            )
        data = to_device(data, device)
        with optim_wrapper.optim_context(model):
            outputs = call_model(model, data)
        loss, log_vars = parse_losses(outputs)
        optim_wrapper.update_params(loss)
    log_vars.update(optim_wrapper.get_log_vars())
    return mean_over_ranks(log_vars)


def eval_step(model: nn.Module, name: str, data: Any, device: torch.device) -> Any:
    """The model's outputs for one batch: its own ``name`` (``val_step``, ``test_step``) when
    it has one, else the model called with the batch on ``device``."""
    own = own_method(model, name)
    if own is not None:
        return own(data)
    return call_model(model, to_device(data, device))


def own_method(model: nn.Module, name: str) -> Callable[..., Any] | None:
    """``model.name`` when the user's module defines ``name`` (called through the wrapper
    when the wrapper routes it, e.g. DDP's ``train_step``), else None."""
    module = unwrap_model(model)
    if not callable(getattr(module, name, None)):
        return None
    wrapped = getattr(model, name, None)
    return wrapped if callable(wrapped) else getattr(module, name)


def to_device(data: Any, device: torch.device) -> Any:
    """``data`` with its tensors on ``device`` (any ``Mapping`` type a collate function returns,
    namedtuples, lists and tuples rebuilt as they were)."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True) if data.device != device else data
    if isinstance(data, Mapping):
        return type(data)({k: to_device(v, device) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(to_device(v, device) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(to_device(v, device) for v in data)
    return data


def call_model(model: nn.Module, data: Any) -> Any:
    if isinstance(data, Mapping):
        return model(**data)
    if isinstance(data, list | tuple):
        return model(*data)
    return model(data)


def parse_losses(outputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss to back-propagate and the values to log, from what ``forward`` returned.

    A dict: the entries whose key contains ``'loss'`` (a tensor, averaged if not a scalar,
    or a list of tensors) are summed; each is logged, and the sum as ``loss``. A scalar
    tensor is the loss itself. Anything else is an error that says what to return.
    """
    if isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
        return outputs, {"loss": outputs.detach()}
    if not isinstance(outputs, Mapping):
        shown = (
            f"a Tensor of shape {tuple(outputs.shape)}"
            if isinstance(outputs, torch.Tensor)
            else f"a {type(outputs).__name__}"
        )
        raise TypeError(
            f"the model's forward returned {shown}, and the default train step needs the loss: "
            "return a dict such as dict(loss=F.cross_entropy(logits, labels)) (entries whose "
            "key contains 'loss' are summed), a scalar loss tensor, or define "
            "train_step(data, optim_wrapper) on the model"
        )
    losses: dict[str, torch.Tensor] = {}
    for key, value in outputs.items():
        if "loss" not in key:
            continue
        if isinstance(value, torch.Tensor):
            losses[key] = value.mean()
        elif isinstance(value, list | tuple) and all(isinstance(v, torch.Tensor) for v in value):
            losses[key] = sum(v.mean() for v in value)
        else:
            raise TypeError(f"loss entry {key!r} is a {type(value).__name__}, not a tensor")
    if not losses:
        raise ValueError(
            f"the model's forward returned a dict with keys {sorted(outputs)}, none of which "
            "contains 'loss': the default train step back-propagates the sum of the entries "
            "whose key contains 'loss'. Return e.g. dict(loss=...), or define "
            "train_step(data, optim_wrapper) on the model"
        )
    loss = sum(losses.values())
    log_vars = {"loss": loss.detach()}
    if list(losses) != ["loss"]:
        log_vars.update({k: v.detach() for k, v in losses.items()})
    return loss, log_vars  # type: ignore[return-value]


def check_log_vars(outputs: Any) -> dict[str, Any]:
    if not isinstance(outputs, Mapping) or not any("loss" in str(k) for k in outputs):
        shown = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise ValueError(
            f"the model's train_step returned {shown}; it must return a dict of logged values "
            "with a 'loss' entry (mmengine's BaseModel.train_step returns parse_losses' "
            "log_vars), e.g. return dict(loss=loss.detach())"
        )
    return dict(outputs)


def mean_over_ranks(log_vars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Logged values as 0-dim float64 tensors on the CPU (what hooks written for mmengine
    expect: ``outputs['loss'].item()``), averaged over the ranks (one copy to the host, one
    collective)."""
    names, values = [], []
    for key, value in log_vars.items():
        if isinstance(value, torch.Tensor):
            values.append(value.detach().float().mean())
        elif isinstance(value, int | float) and not isinstance(value, bool):
            values.append(torch.tensor(float(value)))
        else:
            continue
        names.append(key)
    if not values:
        return {}
    device = next((v.device for v in values if v.device.type != "cpu"), torch.device("cpu"))
    stacked = torch.stack([v.to(device) for v in values]).double()
    if dist.get_world_size() > 1:
        dist.all_reduce(stacked, op="mean")
    return dict(zip(names, stacked.cpu().unbind()))
