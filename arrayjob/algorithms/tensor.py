"""Tensor jobs: MTTKRP and CP decomposition by alternating least squares.

MTTKRP (matricised tensor times Khatri-Rao product), mode 0:
M[i, f] = Σ_jk X[i, j, k] B[j, f] C[k, f], and the analogues for modes 1 and 2 — the
kernel of CP-ALS (Kolda & Bader, SIAM Review 2009). X stays partitioned along its first
mode as stored; the factor matrices are small driver values sent to every block. For
mode 0 each block yields its rows of M; for modes 1 and 2 each block yields a partial
M, summed by a reduction tree. Cost per MTTKRP: one pass over X (8IJK bytes),
about 2IJKF flops, moves (J or K)·F floats per block for modes 1 and 2.

CP-ALS updates one factor per MTTKRP: A ← MTTKRP₀ (BᵀB ∗ CᵀC)⁻¹, and so on, so each
iteration is three passes over X; the fit 1 − ‖X − X̂‖/‖X‖ comes from the last MTTKRP
and ‖X‖ (one pass at load), without forming X̂. The factors are checkpointed after an
iteration (``io.checkpoint``), so a resumed run goes on from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from arrayjob import api as la
from arrayjob.api import (
    EACH_ITERATION,
    InputError,
    Job,
    JobContext,
    JobResult,
    Pass,
    StagePlan,
    require,
    require_numeric,
)

MODES = {0: ("ijk,jf,kf->if", "BC"), 1: ("ijk,if,kf->jf", "AC"), 2: ("ijk,if,jf->kf", "AB")}


def mttkrp_program(X: la.BlockArray, mode: int, factors: Sequence[la.BlockArray]) -> la.BlockArray:
    return la.einsum(MODES[mode][0], X, *factors)


def _check_tensor(job: Job) -> None:
    X = job.arrays["X"]
    require(X.ndim == 3, f"inputs.X: expected a 3-way tensor (I × J × K), got shape {X.shape}")
    require(min(X.shape) > 0, f"inputs.X: expected a non-empty tensor, got shape {X.shape}")
    require_numeric(X)


@dataclass(frozen=True)
class MTTKRPParams:
    mode: int = field(default=0, metadata={"check": lambda v: v in (0, 1, 2), "expect": "0, 1 or 2"})


class MTTKRP(Job):
    name = "mttkrp"
    title = "MTTKRP"
    inputs = ("X", "A", "B", "C")
    optional_inputs = ("A", "B", "C")
    Params = MTTKRPParams
    params: MTTKRPParams

    def check_inputs(self) -> None:
        _check_tensor(self)
        X = self.arrays["X"]
        needed = MODES[self.params.mode][1]
        for name in "ABC":
            if name in needed and name not in self.arrays:
                raise InputError(f"inputs.{name}: mode {self.params.mode} needs factor matrices {needed[0]} and {needed[1]}")
            if name not in needed and name in self.arrays:
                raise InputError(f"inputs.{name}: not used by mode {self.params.mode} (it needs {needed[0]} and {needed[1]})")
        ranks = set()
        for name in needed:
            F = self.arrays[name]
            axis = "ABC".index(name)
            require(F.ndim == 2 and F.shape[0] == X.shape[axis],
                    f"inputs.{name}: expected shape ({X.shape[axis]}, rank) for mode {axis} of X {X.shape}, got {F.shape}")
            require_numeric(F)
            ranks.add(F.shape[1])
        require(len(ranks) == 1, f"inputs.{needed[1]}: expected the same rank (columns) as inputs.{needed[0]}")

    def describe(self) -> str:
        F = self.arrays[MODES[self.params.mode][1][0]].shape[1]
        return f"{self.title} mode {self.params.mode}, rank {F}, on X {' × '.join(f'{s:,}' for s in self.arrays['X'].shape)}"

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        F = self.arrays[MODES[self.params.mode][1][0]].shape[1]
        return [((self.arrays["X"].shape[self.params.mode], F), "float64", None)]

    def stages(self, workers: int) -> StagePlan:
        names = MODES[self.params.mode][1]
        X = la.from_input(self.arrays["X"])
        factors = tuple(la.value(n, self.arrays[n].shape) for n in names)
        M = mttkrp_program(X, self.params.mode, factors)
        return StagePlan((Pass("mttkrp", "compute", {"M": M}),))

    def run(self, ctx: JobContext) -> JobResult:
        names = MODES[self.params.mode][1]
        plan = self.stages(ctx.workers)
        program = plan["mttkrp"]
        with ctx.stage("load"):
            factors = {n: ctx.read_whole(self.arrays[n]) for n in names}
            ctx.load(program)
        with ctx.stage(plan.stage_of("mttkrp")):
            M = ctx.compute(program, factors)["M"]
        return JobResult({"M": M}, {"mode": self.params.mode}, [f"M {M.shape[0]:,} × {M.shape[1]}"])


@dataclass(frozen=True)
class CPParams:
    rank: int = field(metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    max_iter: int = field(default=100, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    tol: float = field(default=1e-8, metadata={"check": lambda v: v >= 0 and np.isfinite(v), "expect": "a number >= 0"})
    seed: int = 0


def random_factors(shape: tuple[int, ...], rank: int, seed: int) -> list[np.ndarray]:
    """TensorLy's ``init="random"`` start: uniform [0, 1) factors from ``RandomState(seed)``."""
    rng = np.random.RandomState(seed)
    return [rng.random_sample((s, rank)) for s in shape]


class CPALS(Job):
    name = "cp_als"
    title = "CP decomposition (ALS)"
    inputs = ("X",)
    Params = CPParams
    params: CPParams

    def check_inputs(self) -> None:
        _check_tensor(self)

    def describe(self) -> str:
        return f"{self.title}, rank {self.params.rank}, on X {' × '.join(f'{s:,}' for s in self.arrays['X'].shape)}"

    def stages(self, workers: int) -> StagePlan:
        """‖X‖² at load, then each iteration one MTTKRP per mode (``mode0``, ``mode1``, ``mode2``)."""
        X = la.from_input(self.arrays["X"])
        shape, F = self.arrays["X"].shape, self.params.rank
        passes = [Pass("norm", "load", {"norm_sq": (X * X).sum()})]
        for mode, (_, names) in MODES.items():
            factors = tuple(la.value(n, (shape["ABC".index(n)], F)) for n in names)
            passes.append(Pass(f"mode{mode}", "fit", {"M": mttkrp_program(X, mode, factors)},
                               EACH_ITERATION))
        return StagePlan(tuple(passes))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        F = self.params.rank
        return [((F,), "float64", None), *(((s, F), "float64", None) for s in self.arrays["X"].shape)]

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        shape = self.arrays["X"].shape
        plan = self.stages(ctx.workers)
        norm_program = plan["norm"]
        with ctx.stage("load"):
            ctx.load(norm_program)
            norm_x = float(np.sqrt(ctx.compute(norm_program)["norm_sq"]))
            saved = ctx.restore()  # the factors after an iteration, the fit, the last error
        if saved is None:
            factors = random_factors(shape, p.rank, p.seed)
            fit, previous_error, iterations, done = 0.0, None, 0, False
        else:
            st = saved.state
            factors = [st["A"], st["B"], st["C"]]
            fit, iterations, done = float(st["fit"]), int(st["iteration"]), bool(st["done"])
            previous_error = None if st["previous_error"] is None else float(st["previous_error"])
        with ctx.stage(plan.stage_of("mode0")):
            while not done and iterations < p.max_iter:
                iterations += 1
                for mode in range(3):
                    names = MODES[mode][1]
                    others = [factors["ABC".index(n)] for n in names]
                    M = ctx.compute(plan[f"mode{mode}"], dict(zip(names, others, strict=True)))["M"]
                    gram = (others[0].T @ others[0]) * (others[1].T @ others[1])
                    factors[mode] = np.linalg.solve(gram.T, M.T).T
                # ‖X̂‖² = 1ᵀ(AᵀA ∗ BᵀB ∗ CᵀC)1 and ⟨X, X̂⟩ = Σ A ∗ M₀ (M of the last mode, before its update)
                norm_model_sq = float(np.sum(np.prod([f.T @ f for f in factors], axis=0)))
                inner = float(np.sum(factors[2] * M))
                error = np.sqrt(abs(norm_x**2 - 2 * inner + norm_model_sq)) / norm_x
                fit = 1.0 - error
                done = previous_error is not None and abs(previous_error - error) < p.tol
                previous_error = error
                ctx.iteration(iterations, p.max_iter, fit=fit)
                ctx.checkpoint(iterations, {"A": factors[0], "B": factors[1], "C": factors[2], "fit": fit,
                                            "previous_error": float(error), "iteration": iterations,
                                            "done": bool(done)})
        norms = [np.linalg.norm(f, axis=0) for f in factors]
        weights = np.prod(norms, axis=0)
        arrays = {"weights": weights}
        for name, f, n in zip("ABC", factors, norms, strict=True):
            arrays[name] = f / np.where(n == 0, 1.0, n)
        attrs = {"fit": float(fit), "iterations": iterations, "rank": p.rank}
        return JobResult(arrays, attrs, [f"{iterations} iterations: fit {fit:.6f}"])
