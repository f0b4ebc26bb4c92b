"""How a block contraction is computed, decided from subscripts and shapes alone.

The kernel compiler (``arrayjob.kernels``) runs these decisions; the cost model prices
by them. Pure functions of plain values, so their caches are safe to share.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from arrayjob.planner.ops import parse_einsum

# A contraction of three or more blocks whose first product is bigger than this runs in
# pieces along the big block's first axis, so each piece's product is still in cache when
# the rest contracts it: MTTKRP on a (100, 400, 400) block, rank 32, one thread, 44 ms
# whole, 38 ms in pieces of 5 slabs (``benchmarks/bench_micro.py mttkrp-gemm``).
PIECE_BYTES = 512 * 2**10
# A first product whose partner keeps at most this many columns (rank 32 in MTTKRP) is run as
# partnerᵀ @ bigᵀ, its result's rows the partner's: OpenBLAS packs the big block along the
# long side of the output then. One (100, 400, 400) block, rank 32, one thread:
# X(ij, k) @ C 41.6 ms (24.6 GFLOP/s), Cᵀ @ X(ij, k)ᵀ 30.6 ms (33.5 GFLOP/s); the gain holds
# to 128 columns and reverses by 256 (``benchmarks/bench_micro.py mttkrp-gemm``).
NARROW_COLUMNS = 128


@functools.lru_cache(maxsize=512)
def pieces(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[int, int, int] | None:
    """(big block, rows per piece, the output axis pieces stack on) when the first product
    ``blas_pair`` makes is over ``PIECE_BYTES`` and the big block's first axis is kept in
    the output and appears in no other block; else None."""
    (big, other, axes, _), _ = blas_pair(subscripts, shapes)
    terms, out = parse_einsum(subscripts)
    label = terms[big][0]
    if 0 in axes[0] or label not in out or any(label in t for k, t in enumerate(terms) if k != big):
        return None
    row_bytes = 8 * math.prod(shapes[big][1:]) // math.prod(shapes[big][a] for a in axes[0]) \
        * math.prod(size for a, size in enumerate(shapes[other]) if a not in axes[1])
    rows = max(1, PIECE_BYTES // max(1, row_bytes))
    if rows >= shapes[big][0]:
        return None
    return big, rows, out.index(label)


@functools.lru_cache(maxsize=512)
def blas_pair(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> Any:
    """For a contraction of three or more blocks: the largest block and a partner whose labels
    it shares are all summed away and lie at the start or the end of the large block's axes,
    so one GEMM on a free reshape contracts them. Returns ((big, partner, axes, partner
    first?), the subscripts of what remains with the pair's result first), or None.

    MTTKRP ``ijk,jf,kf->if`` on a (40, 400, 400) block: ``np.einsum(optimize=True)`` contracts
    j first (a copy of X, then einsum's C loop over f) in 25 ms; X(ij, k) @ C, then
    ``ijf,jf->if``, runs at GEMM speed."""
    terms, out = parse_einsum(subscripts)
    if any(len(set(t)) != len(t) for t in terms):
        return None
    big = max(range(len(terms)), key=lambda k: math.prod(shapes[k]))
    a = terms[big]
    for other, b in enumerate(terms):
        if other == big:
            continue
        shared = [label for label in a if label in b]
        elsewhere = set(out).union(*(t for k, t in enumerate(terms) if k not in (big, other)))
        if not shared or set(shared) & elsewhere:
            continue
        at_end, at_start = a.endswith("".join(shared)), a.startswith("".join(shared))
        if not (at_end or at_start):
            continue
        axes = ([a.index(x) for x in shared], [b.index(x) for x in shared])
        free_a, free_b = [x for x in a if x not in shared], [x for x in b if x not in shared]
        narrow = math.prod(size for x, size in zip(b, shapes[other], strict=True) if x not in shared) <= NARROW_COLUMNS
        partner_first = at_start and not at_end or narrow
        result = "".join(free_b + free_a) if partner_first else "".join(free_a + free_b)
        rest = [result] + [t for k, t in enumerate(terms) if k not in (big, other)]
        return (big, other, axes, partner_first), ",".join(rest) + "->" + out
    return None


@functools.lru_cache(maxsize=512)
def pairwise(subscripts: str) -> tuple[tuple[list[int], list[int]], tuple[int, ...] | None] | None:
    """For a plain two-operand contraction (``ij,j->i``, ``ji,j->i``, ``ik,ij->kj``): the
    ``tensordot`` axes and the transpose of its result (None when none is needed), so BLAS
    runs it without ``einsum``'s path search, which costs more than the product on small
    blocks. None for diagonals, batch labels or labels summed within one operand."""
    terms, out = parse_einsum(subscripts)
    if len(terms) != 2:
        return None
    a, b = terms
    shared = [label for label in a if label in b]
    if any(len(set(t)) != len(t) for t in (a, b, out)) or set(shared) & set(out) \
            or set(a + b) - set(shared) != set(out):
        return None
    axes = ([a.index(label) for label in shared], [b.index(label) for label in shared])
    free = [label for label in a + b if label not in shared]
    perm = tuple(free.index(label) for label in out)
    return axes, (None if perm == tuple(range(len(perm))) else perm)
