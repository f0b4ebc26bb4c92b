"""Alternating least squares: the job, its two layouts of the ratings, the per-row solves and
the scoring of a fitted model."""

from arrayjob.algorithms.als.job import ALS

__all__ = ["ALS"]
