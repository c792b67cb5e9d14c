"""A single-turn verifiers taskset for the tests: "a + b = ?" scored by two weighted rewards.

Written against the real ``verifiers.v1`` API (a ``Taskset`` yielding typed ``Task``s whose
``@vf.reward`` methods score the trace); installed for the tests by putting this folder on
``sys.path`` (the taskset id is the module name).
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class SumData(vf.TaskData):
    a: int
    b: int


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return 1.0 if str(task.a + task.b) in trace.last_reply else 0.0

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 6 else 0.0


class SumConfig(vf.TasksetConfig):
    count: int = 8
    largest: int = 9


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> Iterator[SumTask]:
        for i in range(self.config.count):
            a, b = i % (self.config.largest + 1), (3 * i + 1) % (self.config.largest + 1)
            data = SumData(prompt=f"{a} + {b} =", system_prompt="Answer with the number.", a=a, b=b)
            yield SumTask(data, self.config.task)


__all__ = ["SumTaskset"]
