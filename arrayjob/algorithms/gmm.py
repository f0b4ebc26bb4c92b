"""Gaussian mixture, fitted by expectation–maximisation, one pass over X per iteration.

The model p(x) = Σₖ πₖ N(x; μₖ, Σₖ) with full or diagonal covariances, fitted by EM
(Dempster, Laird & Rubin 1977; Bishop, *PRML* §9.2) exactly as scikit-learn's
``GaussianMixture`` runs it, so that the two agree given the same initial parameters:

- E-step, per row block: log N(x; μₖ, Σₖ) from the Cholesky factor Pₖ of each precision
  (Σₖ⁻¹ = PₖPₖᵀ; scikit-learn's ``_estimate_log_gaussian_prob``): y = xPₖ − μₖPₖ, then
  −½‖y‖² + log det Pₖ − (d/2) log 2π (diagonal: the same expanded as x²·pₖ − 2x·(μₖpₖ) +
  μₖ²·pₖ, with pₖ the precisions, as scikit-learn does); plus log πₖ; a max-shifted
  log-sum-exp over the components gives each row's log-likelihood ℓᵢ and the
  responsibilities rᵢₖ = exp(log πₖN(xᵢ) − ℓᵢ).
- In the same kernel, the M-step's sufficient statistics: Nₖ = Σᵢ rᵢₖ, Σᵢ rᵢₖxᵢ and
  Σᵢ rᵢₖxᵢxᵢᵀ (diagonal: Σᵢ rᵢₖxᵢ²), summed over the blocks in a tree, and Σᵢ ℓᵢ.
- On the driver: πₖ = Nₖ/n, μₖ = Σrx/Nₖ, Σₖ = Σrxxᵀ/Nₖ − μₖμₖᵀ + ``reg_covar``·I (Nₖ
  plus 10 machine epsilons, as scikit-learn's), and the Cholesky factors for the next pass.
  The lower bound is the mean log-likelihood (ℓ summed / n) of the parameters the pass ran
  with; EM stops when it changes by less than ``tol`` (scikit-learn's rule), and a last pass
  labels each row with its most probable component (argmaxₖ log πₖN(xᵢ)), written by the
  workers.

X is shifted by its column means (from the load pass) inside the kernels, so the sums of
squares do not lose digits when X sits far from the origin; the driver shifts back.

Initialisation: ``k-means++`` (``algorithms.kmeans.kmeans_plus_plus`` on a sample of at most 100k
rows, as k-means seeds), ``random`` rows of that sample, or a URI of a (k, d) array of means;
then weights 1/k and every component's covariance the covariance of all of X (divided by n,
plus ``reg_covar`` on the diagonal), from the load pass's sums (XᵀX/n − x̄x̄ᵀ: about
ε·(|x̄|/spread)² relative error, where the EM passes, shifted, lose nothing).

Dense X only (``sparse_inputs`` is empty: a sparse X is refused in one line before it is
read): the shift by X's mean and the n × k × d products would make a sparse X dense anyway.

Cost per iteration: one pass over X (8nd bytes in memory); full covariances about 4nkd²
flops (xPₖ for every k, and the sums of rxxᵀ), an n × k × d temporary per block; diagonal
about 8nkd; 2nk exponentials. Moves k(d² + d + 1) + 1 floats per block (diagonal:
k(2d + 1) + 1). The state (weights, means, covariances, lower bound) is checkpointed after
each iteration; a resumed run goes on from it. The final labelling pass costs as much as
the log-densities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NoReturn

import numpy as np
import scipy.linalg

from arrayjob import api as la
from arrayjob.algorithms.kmeans import seed_centres
from arrayjob.api import (
    EACH_ITERATION,
    InputError,
    Job,
    JobContext,
    JobResult,
    Pass,
    StagePlan,
    Written,
    open_array_info,
    parse_uri,
    require,
    require_matrix,
)

# added to every Nₖ, as scikit-learn's ``_estimate_gaussian_parameters`` does: an empty
# component divides by it instead of by zero
NK_FLOOR = 10 * np.finfo(np.float64).eps


@dataclass(frozen=True)
class GMMParams:
    k: int = field(metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    covariance: Literal["full", "diag"] = "full"
    reg_covar: float = field(default=1e-6, metadata={"check": lambda v: v >= 0 and np.isfinite(v),
                                                     "expect": "a number >= 0"})
    # or "random", or the URI of a (k, d) array of means (a relative path: as the spec's inputs)
    init: str = field(default="k-means++", metadata={"uri": ("k-means++", "random")})
    seed: int = 0
    max_iter: int = field(default=100, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    tol: float = field(default=1e-3, metadata={"check": lambda v: v >= 0 and np.isfinite(v),
                                               "expect": "a number >= 0"})


@dataclass(frozen=True)
class Mixture:
    """The parameters of a mixture: weights (k,), means (k, d), covariances (k, d, d) or (k, d)."""

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray

    @property
    def diagonal(self) -> bool:
        return self.covariances.ndim == 2

    def pass_values(self, shift: np.ndarray, when: str) -> dict[str, np.ndarray]:
        """What a pass over X needs (``gmm_program``'s values), from the means relative to
        ``shift`` and the precisions' Cholesky factors; ``when`` names the iteration for the
        error a covariance that is not positive definite ends the run with."""
        d = self.means.shape[1]
        centred = self.means - shift
        chol = precision_cholesky(self.covariances, when)
        if self.diagonal:
            precision = chol**2
            log_det = np.log(chol).sum(axis=1)
            values = {"precision": precision, "mean_precision": centred * precision,
                      "mean_sq_precision": (centred**2 * precision).sum(axis=1)}
        else:
            log_det = np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
            values = {"precision_chol": chol, "mean_chol": np.einsum("kj,kjl->kl", centred, chol)}
        with np.errstate(divide="ignore"):  # a weight of 0 is a component no row can take
            log_weights = np.log(self.weights)
        return values | {"shift": shift, "log_norm": log_weights + log_det - 0.5 * d * math.log(2 * math.pi)}


def precision_cholesky(covariances: np.ndarray, when: str) -> np.ndarray:
    """Pₖ with PₖPₖᵀ = Σₖ⁻¹, upper triangular (scikit-learn's ``precisions_cholesky_``), or
    1/√σ² for diagonal covariances; a covariance that is not positive definite is one line."""
    if covariances.ndim == 2:
        if not np.all(covariances > 0):
            _collapsed(int(np.argwhere(~(covariances > 0))[0, 0]), when)
        return 1.0 / np.sqrt(covariances)
    chol = np.empty_like(covariances)
    for j, cov in enumerate(covariances):
        # LAPACK's potrf and trtri: L with LLᵀ = Σ, then P = L⁻ᵀ (scikit-learn solves LX = I for
        # L⁻¹; trtri inverts in place, without solve_triangular's level-3 call, which a busy
        # machine's BLAS threads made take 40 ms on a 3 × 3)
        lower, info = scipy.linalg.lapack.dpotrf(cov, lower=1, clean=1)
        if info != 0:
            _collapsed(j, when)
        inverse, info = scipy.linalg.lapack.dtrtri(lower, lower=1)
        if info != 0:
            _collapsed(j, when)
        chol[j] = inverse.T
    return chol


def _collapsed(component: int, when: str) -> NoReturn:
    raise InputError(f"params.reg_covar: the covariance of component {component} {when} is not positive definite "
                     "(it collapsed onto too few distinct rows); lower params.k or raise params.reg_covar")


def gmm_program(X: la.BlockArray, k: int, covariance: str, final: bool) -> dict[str, la.BlockArray]:
    """One EM pass (the log-likelihood ``loglik`` and the sufficient statistics ``nk``,
    ``sum_x``, ``sum_xx``, all of X shifted by ``shift``), or the ``final`` pass (``labels``)."""
    d = X.shape[1]
    Xc = X - la.value("shift", (d,))
    if covariance == "full":
        y = la.einsum("ij,kjl->ikl", Xc, la.value("precision_chol", (k, d, d))) - la.value("mean_chol", (k, d))
        distance = la.square(y).sum(axis=2)  # (x − μ)ᵀ Σ⁻¹ (x − μ), (n, k)
    else:
        distance = ((Xc * Xc) @ la.value("precision", (k, d)).T - 2.0 * (Xc @ la.value("mean_precision", (k, d)).T)
                    + la.value("mean_sq_precision", (k,)))
    log_prob = la.value("log_norm", (k,)) - 0.5 * distance  # log πₖ N(x; μₖ, Σₖ)
    if final:
        return {"labels": log_prob.argmax(axis=1, keepdims=True).sum(axis=1)}  # (n, 1) -> (n,)
    top = log_prob.max(axis=1, keepdims=True)
    loglik = la.log(la.exp(log_prob - top).sum(axis=1, keepdims=True)) + top  # (n, 1)
    resp = la.exp(log_prob - loglik)
    sum_xx = la.einsum("ik,ij,il->kjl", resp, Xc, Xc) if covariance == "full" else resp.T @ (Xc * Xc)
    return {"loglik": loglik.sum(), "nk": resp.sum(axis=0), "sum_x": resp.T @ Xc, "sum_xx": sum_xx}


class GaussianMixture(Job):
    name = "gmm"
    title = "Gaussian mixture"
    inputs = ("X",)
    row_input = "X"  # labels, one per row of X
    Params = GMMParams
    params: GMMParams

    def check_inputs(self) -> None:
        X = self.arrays["X"]
        require_matrix(X)
        require(self.params.k <= X.shape[0], f"params.k: {self.params.k} components but inputs.X has only "
                                             f"{X.shape[0]} rows")
        if self.params.init not in ("k-means++", "random"):
            location = parse_uri(self.params.init, key="params.init")
            self.init_array = open_array_info("init", location, self.storage)
            shape = (self.params.k, X.shape[1])
            require(self.init_array.shape == shape,
                    f"params.init: expected a ({shape[0]}, {shape[1]}) array of means, got {self.init_array.shape}")

    def describe(self) -> str:
        X = self.arrays["X"]
        return (f"{self.title} ({self.params.covariance} covariances), k = {self.params.k}, "
                f"on X {X.shape[0]:,} × {X.shape[1]:,}")

    def _covariances_shape(self) -> tuple[int, ...]:
        k, d = self.params.k, self.arrays["X"].shape[1]
        return (k, d, d) if self.params.covariance == "full" else (k, d)

    def stages(self, workers: int) -> StagePlan:
        """X's column sums and second moments at load (the shift and the initial covariance),
        an EM pass per iteration, and the final pass (labels, which the workers write)."""
        X = la.from_input(self.arrays["X"])
        p = self.params
        moments = la.einsum("ij,ik->jk", X, X) if p.covariance == "full" else (X * X).sum(axis=0)
        return StagePlan((
            Pass("moments", "load", {"sum": X.sum(axis=0), "sum_xx": moments}),
            Pass("em", "fit", gmm_program(X, p.k, p.covariance, final=False), EACH_ITERATION),
            Pass("labels", "fit", gmm_program(X, p.k, p.covariance, final=True),
                 writes={"labels": Written((X.shape[0],), (self.arrays["X"].chunks[0],), "int64", self.arrays["X"])}),
        ))

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        X = self.arrays["X"]
        k, d = self.params.k, X.shape[1]
        return [((k,), "float64", None), ((k, d), "float64", None), (self._covariances_shape(), "float64", None),
                ((X.shape[0],), "int64", X.chunks[0])]

    def initial(self, ctx: JobContext, mean: np.ndarray, second_moment: np.ndarray) -> Mixture:
        """Means from ``params.init``; weights 1/k; every covariance X's (plus ``reg_covar``)."""
        p = self.params
        if p.init in ("k-means++", "random"):
            means = seed_centres(self.arrays["X"], p.init, p.k, p.seed, ctx.storage)
        else:
            means = ctx.read_whole(self.init_array).astype(np.float64)
            if not np.isfinite(means).all():
                raise InputError("params.init: the initial means hold NaN or infinite values")
        if p.covariance == "full":
            cov = second_moment - np.outer(mean, mean)
            cov.flat[:: cov.shape[0] + 1] += p.reg_covar
        else:
            cov = second_moment - mean**2 + p.reg_covar
        return Mixture(np.full(p.k, 1.0 / p.k), means, np.repeat(cov[None], p.k, axis=0))

    def maximise(self, r: dict[str, np.ndarray], shift: np.ndarray) -> Mixture:
        """The M-step from one pass's sums (scikit-learn's ``_estimate_gaussian_parameters``)."""
        nk = r["nk"] + NK_FLOOR
        centred = r["sum_x"] / nk[:, None]
        if self.params.covariance == "full":
            cov = r["sum_xx"] / nk[:, None, None] - np.einsum("kj,kl->kjl", centred, centred)
            d = cov.shape[1]
            cov[:, range(d), range(d)] += self.params.reg_covar
        else:
            cov = r["sum_xx"] / nk[:, None] - centred**2 + self.params.reg_covar
        return Mixture(nk / nk.sum(), centred + shift, cov)

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        n = self.arrays["X"].shape[0]
        plan = self.stages(ctx.workers)
        em = plan["em"]
        with ctx.stage("load"):
            ctx.load(em)
            m = ctx.compute(plan["moments"])
            shift = m["sum"] / n
            saved = ctx.restore()  # the mixture after an iteration, and where EM stood
            if saved is None:
                mixture = self.initial(ctx, shift, m["sum_xx"] / n)
                lower_bound, iterations, converged = -np.inf, 0, False
            else:
                st = saved.state
                mixture = Mixture(st["weights"], st["means"], st["covariances"])
                lower_bound, iterations, converged = float(st["lower_bound"]), int(st["iteration"]), bool(st["converged"])
        with ctx.stage(plan.stage_of("em")):
            while not converged and iterations < p.max_iter:
                when = "at the start" if iterations == 0 else f"after iteration {iterations}"
                r = ctx.compute(em, mixture.pass_values(shift, when))
                previous, lower_bound = lower_bound, float(r["loglik"]) / n
                mixture, iterations = self.maximise(r, shift), iterations + 1
                change = lower_bound - previous
                converged = abs(change) < p.tol
                ctx.iteration(iterations, p.max_iter, objective=lower_bound, change=change, tol=p.tol)
                ctx.checkpoint(iterations, {"weights": mixture.weights, "means": mixture.means,
                                            "covariances": mixture.covariances, "lower_bound": lower_bound,
                                            "iteration": iterations, "converged": converged})
            values = mixture.pass_values(shift, f"after iteration {iterations}")
            arrays = {"weights": mixture.weights, "means": mixture.means, "covariances": mixture.covariances}
            if ctx.writes_result:  # labels (8n bytes) are written by the workers
                r = ctx.compute(ctx.writing(plan.pass_named("labels")), values)
                ctx.count_writes(plan.pass_named("labels"), r)
            else:
                arrays["labels"] = ctx.compute(plan["labels"], values)["labels"]
        attrs = {"lower_bound": lower_bound, "iterations": iterations, "converged": converged, "k": p.k,
                 "covariance": p.covariance}
        summary = [f"EM {'converged' if converged else 'did NOT converge'} in {iterations} iterations: "
                   f"lower bound (mean log-likelihood) {lower_bound:.10g}"]
        return JobResult(arrays, attrs, summary)
