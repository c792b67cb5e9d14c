"""The --tune-params search with a fake memory meter: exact, hand-checked choices."""

from __future__ import annotations

import logging

import pytest

from areno_core.errors import NotAvailableError
from areno_core.tune.search import (
    MIB,
    TuneSettings,
    derived_batch_size,
    descending_candidates,
    report_lines,
    search,
)

CAPACITY = 1000 * MIB  # with --mem-frac 0.9: a budget of 900 MiB


class FakeProbes:
    """Memory in MiB as simple functions of the candidate; records every call."""

    def __init__(self, *, resident=100, per_seq=10, per_row=40, oom_rollout=(), oom_train=()):
        self.resident, self.per_seq, self.per_row = resident, per_seq, per_row
        self.oom_rollout, self.oom_train = set(oom_rollout), set(oom_train)
        self.calls: list[tuple[str, int]] = []

    def capacity_bytes(self) -> int:
        return CAPACITY

    def rollout_floor(self, running: int) -> int:
        return (self.resident + running * self.per_seq // 2) * MIB  # the KV cache alone

    def rollout(self, running: int) -> int | None:
        self.calls.append(("rollout", running))
        if running in self.oom_rollout:
            return None
        return (self.resident + running * self.per_seq) * MIB

    def train(self, mini_bs: int) -> int | None:
        self.calls.append(("train", mini_bs))
        if mini_bs in self.oom_train:
            return None
        return (self.resident + mini_bs * self.per_row) * MIB


def settings(**overrides) -> TuneSettings:
    values = {"mem_frac": 0.9, "tune_max_samples": 256, "n_samples": 8} | overrides
    return TuneSettings(**values)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(256, [256, 128, 64, 32, 16, 8, 4, 2, 1]), (100, [100, 64, 32, 16, 8, 4, 2, 1]),
     (3, [3, 2, 1]), (1, [1])],
)  # fmt: skip
def test_descending_candidates_start_at_the_limit_then_halve(limit, expected):
    assert descending_candidates(limit) == expected


def test_derived_batch_size_is_one_wave_of_prompts_capped_by_tune_max_samples():
    assert derived_batch_size(64, settings()) == 8
    assert derived_batch_size(60, settings()) == 7
    assert derived_batch_size(4, settings()) == 1  # at least one prompt
    assert derived_batch_size(512, settings(tune_max_samples=128)) == 16


def test_search_picks_the_largest_rollout_and_microbatch_that_fit():
    probes = FakeProbes()
    result = search(settings(), probes)
    # floors: 256 -> 1380 MiB (skipped unrun), 128 -> 740 (run: 1380, over), 64 -> 740 fits
    assert result.max_running_prompts == 64
    assert result.batch_size == 8  # 64 rows // 8 samples
    # training: 64 rows per step; 64 -> 2660, 32 -> 1380, 16 -> 740 fits
    assert result.mini_bs == 16
    assert probes.calls == [("rollout", 128), ("rollout", 64),
                            ("train", 64), ("train", 32), ("train", 16)]  # fmt: skip
    assert result.budget_bytes == 900 * MIB and result.capacity_bytes == CAPACITY
    verdicts = [(t.phase, t.value, t.verdict) for t in result.trials]
    assert verdicts == [
        ("rollout", 256, "skipped: needs at least 1,380 MiB"),
        ("rollout", 128, "over budget"),
        ("rollout", 64, "fits"),
        ("train", 64, "over budget"),
        ("train", 32, "over budget"),
        ("train", 16, "fits"),
    ]


def test_search_treats_out_of_memory_as_not_fitting():
    probes = FakeProbes(oom_rollout={64}, oom_train={16})
    result = search(settings(), probes)
    assert result.max_running_prompts == 32 and result.batch_size == 4
    assert result.mini_bs == 8
    assert [t.verdict for t in result.trials if t.value == 64 and t.phase == "rollout"] == [
        "out of memory"
    ]


def test_given_max_running_prompts_skips_rollout_probing():
    probes = FakeProbes()
    result = search(settings(max_running_prompts=24), probes)
    assert result.max_running_prompts == 24
    assert result.batch_size == 3  # 24 // 8
    assert all(kind == "train" for kind, _ in probes.calls)
    assert result.reasons["max_running_prompts"] == "given; the rollout was not probed"


def test_given_batch_size_and_mini_bs_are_kept_and_the_microbatch_is_measured(caplog):
    probes = FakeProbes()
    with caplog.at_level(logging.WARNING, logger="areno"):
        result = search(settings(batch_size=3, mini_bs=32), probes)
    assert (result.batch_size, result.mini_bs) == (3, 32)
    assert probes.calls[-1] == ("train", 32)  # 100 + 32 x 40 = 1380 MiB: over budget
    assert result.reasons["mini_bs"] == "given, kept although its training step over budget"
    assert "--mini-bs 32 is over budget" in caplog.text


def test_training_candidates_never_exceed_the_steps_rows():
    probes = FakeProbes(per_row=1)
    result = search(settings(batch_size=3), probes)
    assert result.mini_bs == 24  # batch 3 x 8 samples: the first candidate, and it fits
    assert ("train", 24) in probes.calls and ("train", 32) not in probes.calls


def test_nothing_fits_names_the_budget_and_what_to_change():
    probes = FakeProbes(resident=950)
    with pytest.raises(NotAvailableError) as info:
        search(settings(tune_max_samples=4), probes)
    text = str(info.value)
    assert "--mem-frac 0.9 of 1,000 MiB = 900 MiB" in text
    assert "lower --max-new-tokens" in text
    assert probes.calls == []  # every floor was already over budget: nothing ran
    probes = FakeProbes(per_row=2000)
    with pytest.raises(NotAvailableError, match="even a training microbatch of 1 row"):
        search(settings(tune_max_samples=8), probes)


def test_report_lines_give_values_reasons_and_every_trial():
    result = search(settings(), FakeProbes())
    lines = report_lines(result, what="GPU memory")
    assert lines[0] == "--tune-params measured GPU memory: budget 900 MiB (90% of 1,000 MiB)"
    assert lines[1].startswith("  --max-running-prompts 64: the largest candidate that fits")
    assert (
        lines[2]
        == "  --batch-size 8: min(64 rollout rows, --tune-max-samples 256) // --n-samples 8"
    )
    assert lines[3].startswith("  --mini-bs 16: the largest candidate up to the step's 64 rows")
    assert "--drop-rollout-state: on" in lines[4]
    assert lines[5:] == [
        "    rollout --max-running-prompts 256: -, skipped: needs at least 1,380 MiB",
        "    rollout --max-running-prompts 128: 1,380 MiB, over budget",
        "    rollout --max-running-prompts 64: 740 MiB, fits",
        "    train --mini-bs 64: 2,660 MiB, over budget",
        "    train --mini-bs 32: 1,380 MiB, over budget",
        "    train --mini-bs 16: 740 MiB, fits",
    ]
