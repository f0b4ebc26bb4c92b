"""Work by kind: what one operation does, from shapes alone.

Time is not one rate: on one core an exp costs about what 20 additions do, and a matrix ×
vector product is bound by memory, not flops. So the planner counts each operation's work
by kind (``cost.WORK_KINDS``), and whoever prices it (the cost model, placement, the
fusion model, the estimate) divides each kind by the rate ``arrayjob calibrate`` measured
for it (``plan.WorkRates``). The rules that classify an operation live here, once.
"""

from __future__ import annotations

import math

from arrayjob.planner.contraction import pairwise

# Below this many flops per operand byte a two-operand contraction streams its operands
# (matrix × vector, 0.25 flop/byte); above it BLAS is compute-bound (XᵀX with 64 columns: 16).
MEMORY_BOUND_FLOPS_PER_BYTE = 1.0
OPERAND_ITEMSIZE = 8  # contraction operands are counted as float64


def map_work(elements: int, calls: int) -> tuple[str, int]:
    """An elementwise function over ``elements`` with ``calls`` transcendental calls per
    element (``ops.Elementwise.calls``): (kind, amount)."""
    return ("transcendental", elements * calls) if calls else ("elementwise", elements)


def einsum_work(subscripts: str, ins: list[tuple[int, ...]]) -> tuple[str, int, tuple[int, ...]]:
    """A contraction of operands of shapes ``ins``: (kind, amount, output shape)."""
    terms, out = subscripts.split("->")
    sizes: dict[str, int] = {}
    for term, s in zip(terms.split(","), ins, strict=True):
        sizes.update(zip(term, s, strict=True))
    flops = 2 * math.prod(sizes.values())
    shape = tuple(sizes[c] for c in out)
    if len(ins) == 1:
        return "elementwise", math.prod(ins[0]), shape
    if len(ins) == 2 and pairwise(subscripts) is not None:  # tensordot: BLAS
        operand_bytes = OPERAND_ITEMSIZE * sum(math.prod(s) for s in ins)
        if flops < MEMORY_BOUND_FLOPS_PER_BYTE * operand_bytes:
            return "contraction_bytes", operand_bytes, shape
        return "contraction_flops", flops, shape
    return "einsum_flops", flops, shape


def sparse_einsum_work(subscripts: str, ins: list[tuple[int, ...]], density: list[float]) -> tuple[str, float]:
    """A contraction with a sparse operand (``density`` < 1: its fraction of non-zeros), as
    ``kernels.sparse`` runs it: each non-zero times every element of the dense operands'
    labels it lacks (X @ w: nnz; X @ Cᵀ with k centroids: k·nnz); (kind, amount). Its vectors
    are gathered from and scattered into in cache: a wide matrix's blocks are held by columns
    (``io.locations.HELD_BY_COLUMNS_ABOVE``)."""
    terms, _ = subscripts.split("->")
    sizes: dict[str, int] = {}
    for term, s in zip(terms.split(","), ins, strict=True):
        sizes.update(zip(term, s, strict=True))
    k = min(range(len(ins)), key=lambda i: density[i])
    term = terms.split(",")[k]
    nnz = density[k] * math.prod(ins[k])
    others = math.prod(n for label, n in sizes.items() if label not in term)
    return "sparse_product", nnz * others
