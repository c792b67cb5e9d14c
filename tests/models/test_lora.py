"""LoRA adapters through the Python API: what trains, the reference, exports and engines."""

from __future__ import annotations

import copy

import pytest
import torch

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.errors import ConfigError
from areno_core.models.loading import load_model
from areno_core.models.lora import (
    ALL_LINEAR,
    AdapterWeights,
    LoraAdapter,
    LoraSettings,
    parse_target_modules,
    resolve_target_modules,
    weights_for_engine,
)
from areno_core.rollout.native import NativeEngine
from areno_core.train.batching import collate
from areno_core.train.featurize import preference_trajectories, sft_trajectories
from areno_core.train.forward import policy_outputs
from areno_core.types import SamplingParams

peft = pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

TINY = "random:qwen3-tiny"
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SFT_ROWS = [
    {"prompt": "2+2=", "response": "4"},
    {"prompt": "3+3=", "response": "6"},
    {"prompt": "1+4=", "response": "5"},
    {"prompt": "7+1=", "response": "8"},
]
DPO_ROWS = [
    {"prompt": "2+2=", "chosen": "4", "rejected": "five"},
    {"prompt": "3+3=", "chosen": "6", "rejected": "none"},
    {"prompt": "9+0=", "chosen": "9", "rejected": "ninety"},
]


def lora_model(rank: int = 4, **settings) -> TrainableModel:
    return TrainableModel.from_ckpt(TINY, seed=0, lora=LoraSettings(rank=rank, **settings))


def perturb_adapters(model: TrainableModel, seed: int = 1) -> None:
    """Give lora_B non-zero values so the adapted policy differs from its base."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)


def logits(module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_lora_training_changes_only_adapter_weights():
    model = lora_model()
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    backend = LocalBackend()
    for _ in range(3):
        backend.train(model, SFT_ROWS, algorithm="sft", learning_rate=1e-2, mini_bs=2)
    after = model.policy.state_dict()
    adapter_keys = {k for k in before if ".lora_" in k}
    assert adapter_keys and len(adapter_keys) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    for key, value in before.items():
        if key in adapter_keys and "lora_B" in key:
            assert not torch.equal(after[key], value), f"{key} did not train"
        elif key not in adapter_keys:
            assert torch.equal(after[key], value), f"{key} changed"
    trained = {id(p) for g in model.optimizer.param_groups for p in g["params"]}
    assert trained == {id(p) for p in model.adapter.trainable_parameters()}


def test_lora_on_a_bfloat16_base_trains_float32_adapters_without_master_weights():
    from areno_core.accel.master_weights import MasterWeightOptimizer

    model = TrainableModel.from_ckpt(TINY, seed=0, dtype=torch.bfloat16, lora=LoraSettings(rank=4))
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    LocalBackend().train(model, DPO_ROWS, algorithm="dpo", learning_rate=1e-2, mini_bs=3)
    after = model.policy.state_dict()
    assert model.dtype == torch.bfloat16  # the base stays in 16 bits
    assert {p.dtype for p in model.adapter.trainable_parameters()} == {torch.float32}
    assert not isinstance(model.optimizer, MasterWeightOptimizer)
    changed = {k for k in before if not torch.equal(after[k], before[k])}
    assert changed and all(".lora_" in k for k in changed)


def test_lora_reference_is_the_base_model_without_a_copy():
    model = lora_model()
    backend = LocalBackend()
    for _ in range(2):
        backend.train(model, DPO_ROWS, algorithm="dpo", learning_rate=1e-2, mini_bs=2)
    assert model.reference is None  # the base is scored through the policy, never copied
    trajectories, _ = preference_trajectories(
        DPO_ROWS, model.tokenizer, max_prompt_tokens=64, max_new_tokens=16
    )
    batch = collate(trajectories, model.pad_id)
    plan = [list(range(batch["input_ids"].shape[0]))]
    model.policy.train()
    reference = backend._updater.reference_logprobs(model, batch, plan, 1.0)
    assert model.policy.training  # scored in eval mode, then put back as it was
    base = load_model(TINY)
    expected = policy_outputs(base, batch)["logprobs"]
    torch.testing.assert_close(reference, expected, atol=0.0, rtol=0.0)
    adapted = policy_outputs(model.policy, batch)["logprobs"].detach()
    assert (adapted - expected).abs().max() > 1e-3  # the adapters did move the policy
    assert all(p.requires_grad for p in model.adapter.trainable_parameters())


def test_lora_loss_and_gradients_equal_the_same_adapter_built_by_hand_with_peft():
    model = lora_model(rank=4)
    perturb_adapters(model)
    by_hand = peft.get_peft_model(
        load_model(TINY),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=PROJECTIONS, task_type="CAUSAL_LM"),
    )
    peft.set_peft_model_state_dict(by_hand, model.adapter.adapter_state_dict())

    trajectories, _ = sft_trajectories(
        SFT_ROWS, model.tokenizer, max_prompt_tokens=64, max_new_tokens=16
    )
    batch = collate(trajectories, model.pad_id)
    out = by_hand(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = batch["loss_mask"][:, 1:]
    loss = -(picked * mask).sum() / mask.sum()
    loss.backward()
    expected_grads = {
        n.replace("base_model.model.", "", 1): p.grad
        for n, p in by_hand.named_parameters()
        if p.requires_grad
    }

    grads: dict[str, torch.Tensor] = {}
    for name, p in model.policy.named_parameters():
        if p.requires_grad:
            p.register_hook(lambda g, name=name: grads.__setitem__(name, grads.get(name, 0) + g))
    result = LocalBackend().train(
        model, SFT_ROWS, algorithm="sft", learning_rate=1e-3, mini_bs=4, grad_clip_norm=1e9
    )
    torch.testing.assert_close(
        result.metrics["train/loss"], float(loss.detach()), atol=1e-6, rtol=1e-6
    )
    assert set(grads) == set(expected_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-6, rtol=1e-5)


def test_lora_merged_export_equals_the_adapted_forward(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = lora_model()
    perturb_adapters(model)
    model.adapter.save_merged(tmp_path / "merged", model.tokenizer)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    ids = tokenizer("12+34=", return_tensors="pt").input_ids
    want = logits(model.policy, ids)
    # Merging rounds in float32: a bound relative to the logits' scale (docs/lora.md).
    bound = 2e-6 * float(want.abs().max())
    torch.testing.assert_close(logits(exported, ids), want, atol=bound, rtol=0)
    merged = model.adapter.merged_state_dict()
    assert set(merged) == set(load_model(TINY).state_dict())


def test_lora_adapter_saved_in_peft_format_loads_with_peft_from_pretrained(tmp_path):
    model = lora_model()
    perturb_adapters(model)
    model.adapter.save(tmp_path / "adapter")
    loaded = peft.PeftModel.from_pretrained(load_model(TINY), tmp_path / "adapter")
    ids = torch.tensor([[5, 17, 33, 2, 8]])
    torch.testing.assert_close(logits(loaded, ids), logits(model.policy, ids), atol=0, rtol=0)


def test_lora_adapter_load_refuses_an_adapter_of_another_rank(tmp_path):
    lora_model(rank=4).adapter.save(tmp_path / "r4")
    with pytest.raises(ConfigError, match=r"has shape .* use the same --lora-rank"):
        lora_model(rank=8).adapter.load(tmp_path / "r4")
    narrow = lora_model(rank=4, target_modules=("q_proj",))
    with pytest.raises(ConfigError, match="unexpected, e.g."):
        narrow.adapter.load(tmp_path / "r4")


def test_lora_target_modules_default_per_family_and_bad_names_listed():
    policy = load_model(TINY)
    assert resolve_target_modules(policy, None) == PROJECTIONS
    assert resolve_target_modules(policy, ("all-linear",)) == ALL_LINEAR
    assert resolve_target_modules(policy, ("v_proj", "q_proj")) == ["v_proj", "q_proj"]
    with pytest.raises(ConfigError, match="'qkv' is not a linear layer of Qwen3ForCausalLM; its"):
        resolve_target_modules(policy, ("q_proj", "qkv"))
    policy.config.model_type = "some-new-family"
    assert resolve_target_modules(policy, None) == ALL_LINEAR
    assert parse_target_modules(" q_proj, v_proj ,") == ("q_proj", "v_proj")
    assert parse_target_modules("  ") is None
    with pytest.raises(ConfigError, match="give it alone"):
        parse_target_modules("all-linear,q_proj")


def test_lora_settings_alpha_defaults_to_twice_the_rank_and_scales_the_adapter():
    model = lora_model(rank=4)
    layer = model.policy.model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == 2.0
    assert LoraSettings(rank=16, alpha=8).scaling_alpha == 8.0
    assert LoraSettings(rank=16).scaling_alpha == 32.0


def test_lora_attach_twice_or_after_training_is_refused():
    model = lora_model()
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        model.add_lora(LoraSettings(rank=2))
    with pytest.raises(ValueError, match="already carries LoRA adapters"):
        LoraAdapter.attach(model.policy, LoraSettings(rank=2))
    plain = TrainableModel.from_ckpt(TINY)
    LocalBackend().train(plain, SFT_ROWS, algorithm="sft")
    with pytest.raises(ValueError, match="before the first train"):
        plain.add_lora(LoraSettings(rank=2))


def test_lora_weights_for_engine_by_mode(tmp_path):
    model = lora_model()
    perturb_adapters(model)
    assert weights_for_engine(model, "module") is model.policy
    merged = weights_for_engine(model, "merged")
    base = load_model(TINY)
    base.load_state_dict(merged, strict=True)
    ids = torch.tensor([[3, 9, 27, 81]])
    torch.testing.assert_close(logits(base, ids), logits(model.policy, ids), atol=1e-5, rtol=0)
    adapter = weights_for_engine(model, "adapter")
    assert isinstance(adapter, AdapterWeights) and adapter.config["r"] == 4
    loaded = peft.PeftModel.from_pretrained(load_model(TINY), adapter.save(tmp_path / "a"))
    torch.testing.assert_close(logits(loaded, ids), logits(model.policy, ids), atol=0, rtol=0)
    plain = TrainableModel.from_ckpt(TINY)
    assert weights_for_engine(plain, "merged") is plain.policy  # no adapter: the module


def test_lora_weights_for_engine_read_from_a_replica_when_given_one(tmp_path):
    """The distributed backend hands the gathered replica of its sharded policy: the weights
    come from that copy, not from the (sharded) policy."""
    import copy

    model = lora_model()
    perturb_adapters(model, seed=1)
    replica = copy.deepcopy(model.policy)
    perturb_adapters(model, seed=2)  # the replica keeps the adapters of seed 1
    assert weights_for_engine(model, "module", replica) is replica
    merged = weights_for_engine(model, "merged", replica)
    ids = torch.tensor([[3, 9, 27, 81]])
    base = load_model(TINY)
    base.load_state_dict(merged, strict=True)
    torch.testing.assert_close(logits(base, ids), logits(replica, ids), atol=1e-5, rtol=0)
    assert not torch.allclose(logits(base, ids), logits(model.policy, ids), atol=1e-4)
    adapter = weights_for_engine(model, "adapter", replica)
    expected = copy.deepcopy(model)
    expected.adapter.peft_model.load_state_dict(  # the replica's adapter, under PEFT's names
        {f"base_model.model.{k}": v for k, v in replica.state_dict().items()}
    )
    want = expected.adapter.adapter_state_dict()
    assert set(adapter.tensors) == set(want) and len(want) == 28
    for key, tensor in want.items():
        torch.testing.assert_close(adapter.tensors[key], tensor, atol=0, rtol=0)


def test_native_engine_samples_from_the_adapted_policy():
    model = lora_model()
    perturb_adapters(model, seed=3)
    greedy = SamplingParams(max_new_tokens=8, greedy=True, seed=0)
    prompts = [[5, 6, 7, 8], [40, 41]]
    adapted = NativeEngine(model.policy, model.tokenizer).generate(prompts, greedy)
    merged = load_model(TINY)
    merged.load_state_dict(model.adapter.merged_state_dict())
    expected = NativeEngine(merged, model.tokenizer).generate(prompts, greedy)
    base = NativeEngine(load_model(TINY), model.tokenizer).generate(prompts, greedy)
    tokens = [[c.token_ids for c in row] for row in adapted]
    assert tokens == [[c.token_ids for c in row] for row in expected]
    assert tokens != [[c.token_ids for c in row] for row in base]


def test_lora_checkpoint_round_trip_through_the_backend(tmp_path):
    model = lora_model()
    backend = LocalBackend()
    backend.train(model, SFT_ROWS, algorithm="sft", learning_rate=1e-2)
    path = backend.save_checkpoint(model, tmp_path, trainer_state={}, config={})
    assert (path / "adapter_model.safetensors").is_file()
    assert not (path / "model.safetensors").exists()
    restored = lora_model()
    backend.setup(restored, backend.algorithm("sft"), learning_rate=1e-2)
    backend.load_checkpoint(restored, path)
    for (k, a), b in zip(
        model.policy.state_dict().items(), restored.policy.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), k
    plain = TrainableModel.from_ckpt(TINY)
    backend.setup(plain, backend.algorithm("sft"), learning_rate=1e-2)
    with pytest.raises(ConfigError, match="holds a LoRA adapter, not full weights"):
        backend.load_checkpoint(plain, path)


def test_ppo_with_lora_trains_adapters_and_keeps_a_full_critic():
    from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

    model = lora_model()
    item = PromptItem(index=0, row={}, prompt="1+1=", answer="2")
    rows = [([5, 6, 7, 8, 9], 1.0), ([5, 6, 7, 10, 11], 0.0)]
    group = TrajectoryGroup(
        item=item,
        trajectories=[
            Trajectory(
                input_ids=ids,
                loss_mask=[0, 0, 0, 1, 1],
                rollout_logprobs=[0.0, 0.0, 0.0, -1.0, -1.0],
                reward=reward,
                prompt_len=3,
            )
            for ids, reward in rows
        ],
    )
    critic_before = copy.deepcopy(model.ensure_critic().state_dict())
    result = LocalBackend().train(
        model, [group], algorithm="ppo", learning_rate=1e-2, critic_warmup_steps=0
    )
    assert "train/value_loss" in result.metrics and "train/kl" in result.metrics
    assert model.reference is None
    changed = [
        k for k, v in model.critic.state_dict().items() if not torch.equal(v, critic_before[k])
    ]
    assert any(k.startswith("backbone.") for k in changed)  # the critic trains in full


def test_lora_with_activation_checkpointing_gives_the_same_step():
    results = []
    for checkpointing in (False, True):
        model = lora_model()
        result = LocalBackend().train(
            model,
            SFT_ROWS,
            algorithm="sft",
            learning_rate=1e-2,
            activation_checkpointing=checkpointing,
        )
        results.append((result.metrics["train/loss"], result.metrics["train/grad_norm"]))
    assert results[1][1] > 0
    torch.testing.assert_close(results[1], results[0], atol=1e-6, rtol=1e-6)
