"""The built-in algorithms: one module per algorithm, registered by name (``arrayjob.catalog``
resolves a spec's ``algorithm``: these, a user's ``module:Class``, entry points)."""

from __future__ import annotations

from arrayjob.api import Job
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

