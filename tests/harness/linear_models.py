"""What the linear-model tests share: inputs written as a user's pipeline would, a job run on the
in-process executor, and the objectives (NumPy) the jobs minimise, to compare references with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import zarr

from arrayjob.api.job import JobContext, JobResult
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import ArrayInfo, StorageOptions, parse_uri
from arrayjob.io.sparse import open_sparse_info
from arrayjob.planner.plan import ClusterShape, PlanOptions
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.session import Session
from tests.harness.helpers import write_csr_group


def inputs(tmp_path: Path, rows: int = 300, **arrays: Any) -> dict[str, ArrayInfo]:
    """Each array stored under ``tmp_path`` (a SciPy matrix as a CSR group), chunked by ``rows``
    rows (vectors by rows + 70: their blocks need not match X's chunks), and opened as an input.
    A chunk of zeros is written too (zarr leaves it out by default: arrayjob reads that as lost)."""
    options, infos = StorageOptions(), {}
    for name, data in arrays.items():
        uri = str(tmp_path / name)
        if scipy.sparse.issparse(data):
            write_csr_group(uri, scipy.sparse.csr_matrix(data), (700, 500, 300))
            infos[name] = open_sparse_info(name, parse_uri(uri), options).info
        else:
            chunks = (rows, *data.shape[1:]) if data.ndim == 2 else (rows + 70,)
            zarr.create_array(uri, shape=data.shape, chunks=chunks, dtype=data.dtype,
                              config={"write_empty_chunks": True})[...] = data
            infos[name] = open_array_info(name, parse_uri(uri), options)
    return infos


def fit(job: Any, **planner: str) -> tuple[JobResult, RunMetrics]:
    """``job`` run on the in-process executor, planned for 2 nodes × 2 workers."""
    executor = LocalExecutor(StorageOptions())
    session = Session(executor, PlanOptions(cluster=ClusterShape(nodes=2, workers_per_node=2), **planner))
    return job.run(JobContext(session, executor.metrics)), executor.metrics


def penalty(coef: np.ndarray, l1: float, l2: float) -> float:
    return float(l1 * np.abs(coef).sum() + 0.5 * l2 * np.sum(coef * coef))


def rows_of(weights: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n) if weights is None else weights


def binary_objective(X: Any, y: np.ndarray, coef: np.ndarray, intercept: float, l1: float, l2: float,
                     weights: np.ndarray | None = None) -> float:
    """(1/Σr) Σ rᵢ log(1 + exp(−sᵢ zᵢ)) + l1‖w‖₁ + (l2/2)‖w‖²."""
    r = rows_of(weights, len(y))
    loss = np.logaddexp(0.0, -(2 * y - 1) * (X @ coef + intercept))
    return float(r @ loss / r.sum()) + penalty(coef, l1, l2)


def softmax_objective(X: Any, y: np.ndarray, coef: np.ndarray, intercept: np.ndarray, l1: float, l2: float,
                      weights: np.ndarray | None = None) -> float:
    """(1/Σr) Σ rᵢ (log Σₖ exp zᵢₖ − zᵢ,yᵢ) + l1‖W‖₁ + (l2/2)‖W‖²."""
    r = rows_of(weights, len(y))
    Z = np.asarray(X @ coef.T) + intercept
    top = Z.max(axis=1)
    loss = top + np.log(np.exp(Z - top[:, None]).sum(axis=1)) - Z[np.arange(len(y)), y.astype(int)]
    return float(r @ loss / r.sum()) + penalty(coef, l1, l2)


def least_squares_objective(X: Any, y: np.ndarray, coef: np.ndarray, intercept: float, l1: float, l2: float,
                            weights: np.ndarray | None = None) -> float:
    """(1/(2Σw)) Σ wᵢ (xᵢ·w + b − yᵢ)² + l1‖w‖₁ + (l2/2)‖w‖²."""
    r = rows_of(weights, len(y))
    residual = X @ coef + intercept - y
    return float(r @ residual**2 / (2 * r.sum())) + penalty(coef, l1, l2)


def balanced(y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Each row's balanced class weight times its sample weight, as scikit-learn multiplies them."""
    r = rows_of(weights, len(y))
    labels = y.astype(int)
    totals = np.bincount(labels, weights=r)
    return r * (totals.sum() / (np.count_nonzero(totals) * totals))[labels]
