"""The built-in algorithms: one module per algorithm, registered by name (``arrayjob.catalog``
resolves a spec's ``algorithm``: these, a user's ``module:Class``, entry points)."""

from __future__ import annotations

from arrayjob.algorithms.als import ALS
from arrayjob.algorithms.gmm import GaussianMixture
from arrayjob.algorithms.kmeans import KMeans
from arrayjob.algorithms.linreg import LinearRegression
from arrayjob.algorithms.logreg import LogisticRegression
from arrayjob.algorithms.pagerank import PageRank
from arrayjob.algorithms.pca import PCA
from arrayjob.algorithms.predict import Predict
from arrayjob.algorithms.tensor import CPALS, MTTKRP
from arrayjob.algorithms.tsqr import TSQR
from arrayjob.api import Job

JOBS: dict[str, type[Job]] = {
    job.name: job for job in (LogisticRegression, LinearRegression, KMeans, GaussianMixture, PCA, ALS, TSQR, MTTKRP,
                              CPALS, PageRank, Predict)
}

