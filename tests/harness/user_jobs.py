"""A job written on arrayjob.api alone, as a user writes one, whose code fails where its
``fault`` param says: the user-job error cases of tests/unit/api/test_user_jobs.py (named in specs as
``tests.harness.user_jobs:Faulty``; the session Ray's workers import it from the checkout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from arrayjob import api

ROWS = 250  # rows per block


def doubled(block: np.ndarray) -> np.ndarray:
    return 2.0 * block


def fails(block: np.ndarray) -> np.ndarray:
    raise ZeroDivisionError("a kernel of the user's own")  # the line the error names


def misshapen(block: np.ndarray) -> np.ndarray:
    return block[:, :1]


def single(block: np.ndarray) -> np.ndarray:
    return block.astype(np.float32)


BLOCK_FUNCTIONS = {"kernel": fails, "shape": misshapen, "dtype": single}


@dataclass(frozen=True)
class FaultyParams:
    fault: Literal["none", "check", "stages", "run", "kernel", "shape", "dtype"] = "none"
    scale: float = field(default=1.0, metadata={"check": lambda v: v > 0, "expect": "a number > 0"})


class Faulty(api.Job):
    inputs = ("X",)
    Params = FaultyParams
    params: FaultyParams

    def check_inputs(self) -> None:
        api.require_matrix(self.arrays["X"])
        if self.params.fault == "check":
            raise RuntimeError("checking the inputs failed")

    def stages(self, workers: int) -> api.StagePlan:
        X = api.from_input(self.arrays["X"])
        if self.params.fault == "stages":
            {"a": 1}["b"]  # noqa: B018 - a KeyError in the user's code
        fn = BLOCK_FUNCTIONS.get(self.params.fault, doubled)
        (twice,) = api.map_blocks(api.Kernel(fn.__name__, fn), X, block_rows=[ROWS],
                                  outputs=[(X.shape, "float64", ROWS)])
        return api.StagePlan((api.Pass("sums", "fit", {"sums": self.params.scale * twice.sum(axis=0)}),))

    def run(self, ctx: api.JobContext) -> api.JobResult:
        if self.params.fault == "run":
            return api.JobResult({}, {"ratio": 1 / len(self.params.fault[:0])})  # ZeroDivisionError
        with ctx.stage("fit"):
            sums = ctx.compute(self.stages(ctx.workers)["sums"])["sums"]
        return api.JobResult({"sums": sums}, {})
