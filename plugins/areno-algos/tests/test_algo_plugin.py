"""The plugin registers six algorithm specs through the areno hook specs."""

from __future__ import annotations

from importlib.metadata import entry_points

import pluggy
import pytest
import torch
from areno_algos import plugin
from areno_algos.common import combine_stats

from areno_core import hookspecs
from areno_core.algorithm import AlgorithmSpec

EXPECTED = {
    "sft": ("supervised", frozenset(), frozenset()),
    "dpo": ("preference", frozenset({"reference"}), frozenset()),
    "grpo": ("online", frozenset(), frozenset()),
    "gspo": ("online", frozenset(), frozenset()),
    "rloo": ("online", frozenset(), frozenset()),
    "ppo": ("online", frozenset({"critic"}), frozenset({"reference", "reward_model"})),
}


def _registered() -> list[AlgorithmSpec]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin, name="algos")
    pm.check_pending()
    seen: list[AlgorithmSpec] = []
    pm.hook.register_algorithms(register=seen.append)
    return seen


def test_plugin_register_algorithms_gives_six_distinct_specs() -> None:
    specs = _registered()
    assert len(specs) == 6
    assert all(isinstance(s, AlgorithmSpec) for s in specs)
    assert {s.name for s in specs} == set(EXPECTED)
    for spec in specs:
        kind, roles, optional = EXPECTED[spec.name]
        assert (spec.kind, spec.roles, spec.optional_roles) == (kind, roles, optional)
        assert (spec.advantages is not None) == (kind == "online")
        assert spec.needs_values == (spec.name == "ppo")
        assert spec.row_schema.describe().startswith("required: ")


def test_plugin_entry_point_installed_points_at_plugin_module() -> None:
    found = [ep for ep in entry_points(group="areno") if ep.name == "algos"]
    if not found:
        pytest.skip("areno-algos is not installed (pip install -e plugins/areno-algos)")
    assert found[0].value == "areno_algos.plugin"
    assert found[0].load() is plugin


def _meta_inputs(spec: AlgorithmSpec) -> tuple[dict, dict]:
    """Outputs and batch on the meta device: any host sync in a loss would raise there."""
    rows, length = 4, 8

    def meta() -> torch.Tensor:
        return torch.empty(rows, length, device="meta")

    batch = {
        "loss_mask": meta(),
        "old_logprobs": meta(),
        "ref_logprobs": meta(),
        "advantages": meta(),
        "values": meta(),
        "returns": meta(),
        "group_loss_tokens": torch.empty((), device="meta"),
        "group_sequences": torch.empty((), device="meta"),
    }
    outputs = {"logprobs": meta().requires_grad_(True), "entropy": meta(), "values": meta()}
    return outputs, batch


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_loss_meta_tensors_runs_without_host_sync(name: str) -> None:
    spec = {s.name: s for s in plugin.ALGORITHMS}[name]
    outputs, batch = _meta_inputs(spec)
    loss, stats = spec.loss(outputs, batch, spec.config_cls())
    assert loss.shape == () and loss.requires_grad
    assert all(v.shape == () and not v.requires_grad for v in stats.values())
    combine_stats([stats, stats])
