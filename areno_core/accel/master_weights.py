"""Float32 master weights for models trained in a 16-bit type.

A bfloat16 weight near 0.02 moves only in steps of about 1e-4, so an AdamW update of
``lr=1e-6`` applied to it directly is rounded away. :class:`MasterWeightOptimizer` keeps a
float32 copy of every trainable low-precision parameter and lets an ordinary optimizer (AdamW,
or bitsandbytes' 8-bit AdamW) update the copies, whose state is therefore float32 too; after
each step the copies are rounded into the model's weights. Gradients are added up in float32
as well: each backward pass moves the parameter's gradient into its master copy's ``.grad``
(a post-accumulate hook), so accumulating many microbatches loses nothing, and the
low-precision gradient is freed at once.

::

    optimizer = MasterWeightOptimizer(
        param_groups(model.parameters(), weight_decay=0.01),
        lambda groups: torch.optim.AdamW(groups, lr=1e-6),
    )
    loss.backward()
    clip_grad_norm(optimizer.masters, 1.0)   # the float32 gradients live on the masters
    optimizer.step(); optimizer.zero_grad()

Memory per trainable parameter in bfloat16: 2 bytes (weight) + 4 (master) + 4 (master
gradient, between backward and ``zero_grad``) + 8 (AdamW moments) = 18 bytes, against 16 for
float32 training; activations, the reference model and the KV cache take half the memory.

``state_dict()`` holds the masters (key ``master_weights``), so a resumed run continues with the
same float32 values; a state dict without them (written by a float32 run) takes the masters
from the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

MASTER_KEY = "master_weights"


def needs_master_weights(params: Iterable[torch.Tensor]) -> bool:
    """Whether any trainable parameter is in a floating type below float32."""
    return any(p.requires_grad and p.is_floating_point() and p.element_size() < 4 for p in params)


class MasterWeightOptimizer(torch.optim.Optimizer):
    """An optimizer over float32 copies of low-precision parameters (see the module docstring).

    ``groups`` are ordinary parameter groups of the model's parameters; ``make_inner`` builds
    the real optimizer from the same groups with each parameter replaced by its float32 copy.
    Parameters already in float32 are optimized in place (their "copy" is the parameter).
    """

    def __init__(
        self,
        groups: list[dict[str, Any]],
        make_inner: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
    ) -> None:
        self.params: list[torch.Tensor] = []
        self.masters: list[torch.Tensor] = []
        self._hooks: list[Any] = []
        master_groups = []
        for group in groups:
            copies = []
            for p in group["params"]:
                master = p if p.dtype == torch.float32 else self._make_master(p)
                self.params.append(p)
                self.masters.append(master)
                copies.append(master)
            master_groups.append({**group, "params": copies})
        inner = make_inner(master_groups)
        super().__init__([dict(g) for g in master_groups], dict(inner.defaults))
        self.inner = inner
        # One set of groups and one state: the scheduler edits what the inner optimizer reads.
        self.param_groups = inner.param_groups
        self.state = inner.state

    def _make_master(self, param: torch.Tensor) -> torch.Tensor:
        master = param.detach().clone().float()

        def move_grad(p: torch.Tensor) -> None:
            grad = p.grad
            if grad is None:
                return
            if master.grad is None:
                master.grad = grad.float()
            else:
                master.grad.add_(grad)
            p.grad = None

        self._hooks.append(param.register_post_accumulate_grad_hook(move_grad))
        return master

    @property
    def low_precision_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(p, m) for p, m in zip(self.params, self.masters, strict=True) if p is not m]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        result = self.inner.step(closure)
        self.copy_masters_to_params()
        return result

    @torch.no_grad()
    def copy_masters_to_params(self) -> None:
        """Round the float32 masters into the model's weights."""
        for param, master in self.low_precision_pairs:
            param.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        for param in self.params:
            param.grad = None

    def state_dict(self) -> dict[str, Any]:
        state = self.inner.state_dict()
        state[MASTER_KEY] = [m for p, m in zip(self.params, self.masters, strict=True)]
        return state

    @torch.no_grad()
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state = dict(state_dict)
        saved = state.pop(MASTER_KEY, None)
        self.inner.load_state_dict(state)
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state
        if saved is None:  # written by a float32 run: the weights are the masters
            for param, master in self.low_precision_pairs:
                master.copy_(param.float())
            return
        if len(saved) != len(self.masters):
            raise ValueError(
                f"optimizer state holds {len(saved)} master weights, the model has "
                f"{len(self.masters)} trainable parameters"
            )
        for i, (master, value) in enumerate(zip(self.masters, saved, strict=True)):
            if tuple(value.shape) != tuple(master.shape):
                raise ValueError(
                    f"master weight {i} has shape {tuple(value.shape)}, the parameter "
                    f"{tuple(master.shape)}"
                )
            master.copy_(value)
        self.copy_masters_to_params()

    def remove_hooks(self) -> None:
        """Detach from the model (its gradients stay on the parameters again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


__all__ = ["MASTER_KEY", "MasterWeightOptimizer", "needs_master_weights"]
