"""Column statistics with a block function of your own: a ``map_blocks`` job on ``arrayjob.api``.

Each row block of X is summarised on its worker by ``summarise`` (count, mean, sum of squared
deviations from the block's mean, minimum, maximum: a 5 × d array), and the driver merges the
summaries with Chan, Golub & LeVeque's pairwise update (1979), which stays exact where a
sum of squares would cancel. Outputs each column's mean, standard deviation (ddof=0),
minimum and maximum, as NumPy's ``X.mean(0)``, ``X.std(0)``, ``X.min(0)``, ``X.max(0)``.

Cost: one pass over X, about 5·n·d flops; 5·d floats a block come back.

Run it: ``PYTHONPATH=examples/colstats arrayjob run examples/colstats/colstats.toml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from arrayjob import api

SUMMARY_ROWS = 5  # count, mean, squared deviations, min, max


def summarise(block: np.ndarray) -> np.ndarray:
    """One row block's summary, 5 × d (runs on the workers)."""
    mean = block.mean(axis=0)
    return np.stack([np.full(block.shape[1], float(block.shape[0])), mean,
                     ((block - mean) ** 2).sum(axis=0), block.min(axis=0), block.max(axis=0)])


def summarise_cost(shapes: Sequence[tuple[int, ...]]) -> api.Work:
    """What one call does, for the estimate: five passes over the block's elements."""
    rows, cols = shapes[0]
    return {"elementwise": 5.0 * rows * cols}


SUMMARISE = api.Kernel("summarise", summarise)


def merge(summaries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The blocks' summaries (stacked 5-row groups) merged: count, mean, M2, min, max."""
    count, mean, m2, low, high = summaries[:SUMMARY_ROWS]
    for part in summaries[SUMMARY_ROWS:].reshape(-1, SUMMARY_ROWS, summaries.shape[1]):
        n_b, mean_b, m2_b = part[0], part[1], part[2]
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * n_b / total
        m2 = m2 + m2_b + delta**2 * count * n_b / total
        count, low, high = total, np.minimum(low, part[3]), np.maximum(high, part[4])
    return mean, np.sqrt(m2 / count), low, high


@dataclass(frozen=True)
class ColstatsParams:
    block_rows: int = 0  # rows per block; 0: as arrayjob tiles X (aligned with its chunks)


class ColumnStatistics(api.Job):
    title = "column statistics"
    inputs = ("X",)
    Params = ColstatsParams
    params: ColstatsParams

    def check_inputs(self) -> None:
        api.require_matrix(self.arrays["X"])
        api.require(self.params.block_rows >= 0, f"params.block_rows: expected an integer >= 0, got "
                                                 f"{self.params.block_rows}")

    def stages(self, workers: int) -> api.StagePlan:
        info = self.arrays["X"]
        rows = self.params.block_rows or api.row_grid(info, workers=workers).block_shape[0]
        blocks = -(-info.shape[0] // rows)
        kernel = api.Kernel(SUMMARISE.name, SUMMARISE.fn, summarise_cost)
        (summaries,) = api.map_blocks(kernel, api.from_input(info), block_rows=[rows],
                                      outputs=[((blocks * SUMMARY_ROWS, info.shape[1]), "float64", SUMMARY_ROWS)])
        return api.StagePlan((api.Pass("summaries", "fit", {"summaries": summaries}),))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self.arrays["X"].shape[1],), "float64", None)] * 4

    def run(self, ctx: api.JobContext) -> api.JobResult:
        plan = self.stages(ctx.workers)
        with ctx.stage("fit"):
            mean, std, low, high = merge(ctx.compute(plan["summaries"])["summaries"])
        return api.JobResult({"mean": mean, "std": std, "min": low, "max": high},
                             {"rows": self.arrays["X"].shape[0]},
                             [f"{len(mean)} columns of {self.arrays['X'].shape[0]:,} rows"])
