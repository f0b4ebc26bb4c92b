"""PageRank: the job and the graph it iterates over."""

from arrayjob.algorithms.pagerank.job import PageRank

__all__ = ["PageRank"]
