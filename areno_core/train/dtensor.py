"""Module skeletons and sharded modules, as both training backends and the sharded checkpoint
format need them: a weightless copy of a module (:func:`meta_copy`), a real module from one
(:func:`materialise`), and whether a module is sharded by FSDP2 (:func:`is_sharded`)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


def is_sharded(module: nn.Module | None) -> bool:
    from torch.distributed.fsdp import (
        FSDPModule,  # heavy: distributed work only
    )

    return isinstance(module, FSDPModule)


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters are on the meta device (no memory; tied
    parameters stay tied) and whose buffers are real copies (rotary tables and the like are
    not in a state dict, so they must survive). Fill it with :func:`materialise`."""
    memo: dict[int, Any] = {}
    for param in module.parameters():
        if id(param) not in memo:
            empty = torch.empty_like(param, device="meta")
            memo[id(param)] = nn.Parameter(empty, requires_grad=param.requires_grad)
    return copy.deepcopy(module, memo)


def materialise(
    skeleton: nn.Module,
    device: torch.device | str,
    weights: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """A real module from a :func:`meta_copy`: its parameters take ``weights`` (assigned,
    without a copy) or fresh uninitialised memory on ``device``; tied parameters stay tied."""
    module = copy.deepcopy(skeleton)  # meta parameters cost nothing to copy
    fresh: dict[int, nn.Parameter] = {}
    names = {id(p): n for n, p in module.named_parameters()}
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is None:
                continue
            if id(param) not in fresh:
                key = names.get(id(param))
                if weights is None:
                    data = torch.empty_like(param, device=device)
                elif key in weights:
                    data = weights[key]
                else:
                    raise KeyError(f"no weight for {key}")
                fresh[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
            sub._parameters[name] = fresh[id(param)]
    module.to(device)
    if weights is not None:
        expected = set(module.state_dict())
        unknown = sorted(set(weights) - expected)
        if unknown:
            raise KeyError(f"weights not in the model: {', '.join(unknown[:3])}")
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                if name in weights:
                    buffer.copy_(weights[name])
    return module
