"""Scoring users with an ALS model (``algorithms.predict``'s ``als`` scorer): each user's ``top_n``
items by xᵤ·yᵢ, best first, as Spark MLlib's ``ALSModel.recommendForUserSubset`` (and
``recommendForAllUsers``) gives them: every item is a candidate, the ones a user rated
included (MLlib's model keeps factors only, and so does a published arrayjob model).

A block of user ids is scored a slab of users at a time, so the scores held (users × items)
stay near ``SLAB_BYTES`` whatever the item count: a GEMM of the slab's factors with Yᵀ, then
``argpartition`` for the ``top_n`` and a sort of those alone (n·items + n·top_n·log top_n).
Cost: 2·rank·items flops a user, and the selection, which is most of it at a small rank: on
1,000 users × 20,000 items at rank 8, one thread, the GEMM took 0.056 s and ``argpartition``
0.48 s (0.60 s on negated scores; best of seven, under load 20), what 2·10⁷ elements through a
plain elementwise operation take at the shipped profile's rate (1.2·10⁹ a second) times about
30, or 15 on a quieter machine: declared as ``SELECTION_ELEMENTS`` elementwise elements a score
(no work kind of its own to calibrate; a guess between the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SLAB_BYTES = 32 * 2**20  # of scores held at once
SELECTION_ELEMENTS = 20.0  # elementwise elements a score's share of argpartition costs (measured, above)


@dataclass(frozen=True)
class UserIds:
    """What is wrong with a block of user ids (where it is read): one that is not an integer
    in 0..users − 1, the users of the model."""

    users: int

    def __call__(self, block: np.ndarray) -> str | None:
        ids = np.asarray(block).reshape(-1)
        bad = (ids < 0) | (ids >= self.users) | (ids != np.floor(ids))
        if bad.any():
            return f"a user id of {ids[bad][0]:g}, not one of the model's users 0..{self.users - 1}"
        return None


@dataclass(frozen=True)
class TopItems:
    """A block of user ids → (items (n, top_n) int64, ratings (n, top_n) float64)."""

    top_n: int

    def __call__(self, ids: np.ndarray, users: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        who = np.asarray(ids).reshape(-1).astype(np.int64)
        n, count = len(who), items.shape[0]
        best = np.empty((n, self.top_n), dtype=np.int64)
        ratings = np.empty((n, self.top_n))
        slab = max(1, SLAB_BYTES // (8 * count))
        for start in range(0, n, slab):
            scores = users[who[start:start + slab]] @ items.T
            if self.top_n < count:  # the top_n largest, unordered (no negated copy of the scores)
                top = np.argpartition(scores, count - self.top_n, axis=1)[:, count - self.top_n:]
            else:
                top = np.broadcast_to(np.arange(count), scores.shape)
            picked = np.take_along_axis(scores, top, axis=1)
            order = np.argsort(-picked, axis=1, kind="stable")
            best[start:start + slab] = np.take_along_axis(top, order, axis=1)
            ratings[start:start + slab] = np.take_along_axis(picked, order, axis=1)
        return best, ratings


@dataclass(frozen=True)
class TopItemsWork:
    """The declared work (``planner.cost.WORK_KINDS``) of ``TopItems`` on a block: per user, its
    scores (a GEMM row, 2·rank·items flops) and the selection over them (items elements)."""

    items: int
    rank: int
    top_n: int

    def __call__(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, float]:
        n = shapes[0][0]
        return {"contraction_flops": 2.0 * n * self.rank * self.items,
                "elementwise": float(n) * (SELECTION_ELEMENTS * self.items
                                           + self.top_n * max(1.0, np.log2(self.top_n)))}
