"""The algorithm catalog: one module per algorithm, registered by name."""

from __future__ import annotations

from arrayjob.api import Job, SpecError
from arrayjob.jobs.als import ALS
from arrayjob.jobs.gmm import GaussianMixture
from arrayjob.jobs.kmeans import KMeans
from arrayjob.jobs.linreg import LinearRegression
from arrayjob.jobs.logreg import LogisticRegression
from arrayjob.jobs.pagerank import PageRank
from arrayjob.jobs.pca import PCA
from arrayjob.jobs.predict import Predict
from arrayjob.jobs.tensor import CPALS, MTTKRP
from arrayjob.jobs.tsqr import TSQR

JOBS: dict[str, type[Job]] = {
    job.name: job for job in (LogisticRegression, LinearRegression, KMeans, GaussianMixture, PCA, ALS, TSQR, MTTKRP,
                              CPALS, PageRank, Predict)
}


def job_names() -> list[str]:
    return sorted(JOBS)


def get_job(name: str) -> type[Job]:
    try:
        return JOBS[name]
    except KeyError:
        raise SpecError(f"job.algorithm: unknown algorithm {name!r} (expected one of: {', '.join(job_names())})") from None
