"""Steps NumPy does slowly, rewritten as compiled loops (``loops``, numba) in a block program.

*One-hot products.* K-means and other group-by programs build a one-hot matrix ``E[i, j] = (labels[i] == ids[j])``
(n × k) and multiply by it: ``Eᵀ @ X`` sums the rows of X per group, ``E.sum(0)`` counts them
and ``E @ C`` gathers each row's group row. As BLAS products these read and write n × k
temporaries and spend 2nkd flops to add n rows; as loops over the rows (compiled with numba)
they are one pass over X with k comparisons per row. Measured on one 100,000 × 64 block, one
core: ``onehotᵀ @ X`` with the one-hot built per 4,096-row piece 7 ms; the loop 2 ms.

The rewrite keeps each product's meaning for any ``ids`` (a row adds to every column whose id
equals its label, so repeated or missing ids behave as the product does) and each product's
axes, so row sub-blocking treats the rewritten step as the contraction it replaces.

*Nearest rows.* ``(a − s·X @ Cᵀ).argmin(axis=1)`` with C short (k-means' assignment,
``‖c‖² − 2x·c``) runs as one loop over X's rows: k dot products and their argmin per row,
with no n × k scores. One 500,000 × 64 block, k = 8, one core: the loop 32 ms, against
50 ms for the GEMM X @ Cᵀ alone and 68 ms for scores and argmin
(``benchmarks/bench_micro.py kmeans-assign``).

*K-means' step in one pass* (``packed``). When the sums per group of X's rows and their
counts both group by X's nearest rows of C, one loop does the assignment, the sums and the
counts, two rows at a time; its [sums | counts] result lives in an extra slot of the block
program and the two steps take slices of it. One 500,000 × 64 block, k = 8, one core: the
loop 35 ms against 56 ms for the assignment, sums and counts loops it replaces
(``benchmarks/bench_micro.py kmeans-assign``).

*Over CSR blocks.* X may be a CSR row block (``csr``: the compiler passes the sparse arguments
it holds as CSR): the nearest rows, the group sums and k-means' packed step then run as the
same loops over X's non-zeros only (``loops.*_csr``, SystemML's Row template over sparse rows):
per row, ``x·c`` for every c gathers k contiguous floats per non-zero from C held transposed
(d, k), and its values are added into its group's sums in the same visit. No n × k scores,
no one-hot matrix and no SciPy product; k-means' final pass (labels, and the least score of
each row for the inertia) is one such loop too (``_nearest_and_least``). A job that knows X
is sparse binds the centroids
transposed (``algorithms.kmeans.nearest_centroid``, ``X @ Cᵀ`` as ``einsum("ij,jk->ik")``); given as
(k, d) they are transposed per call.

*Arg-reductions over short rows.* ``argmin``/``argmax`` over the last axis of an n × k array
with k small (k-means' nearest centroid) is a strided loop per row in NumPy: 55 µs for a
3,236 × 8 piece against 14 µs as a loop (NaN wins, as in NumPy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from arrayjob.kernels.row_layouts import CSRRows
from arrayjob.planner.ops import Const, Einsum, Map, Reduce

CACHE_LINE = 64  # bytes
SHORT_ROW = 64  # arg-reductions over at most this many columns run as loops


@dataclass(frozen=True)
class Rewrite:
    """A step replaced by a loop: what it reads, its axes as einsum labels, and the loop."""

    inputs: tuple[int, ...]
    subscripts: str  # the axes of inputs and output, for the row analysis ("rz,c,rm->cm")
    run: Callable[[list[Any]], Any]
    loop: str = ""  # the loop's name in ``loops``
    scale: float = 1.0  # nearest rows' s
    transposed: bool = False  # nearest rows' C given as (d, k)
    csr: tuple[int, ...] = ()  # the inputs read as CSR blocks (the loop takes them sparse)


@dataclass(frozen=True)
class Packed:
    """Steps one loop computes together, into one array (an extra slot of the program); each
    step's value is a slice of it."""

    inputs: tuple[int, ...]
    subscripts: str
    run: Callable[[list[Any]], Any]
    shape: tuple[int, ...]
    parts: dict[int, Callable[[Any], Any]]  # step index -> its value from the packed array


def rewrites(kernel: Any, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str],
             csr: frozenset[int] = frozenset()) -> dict[int, Rewrite]:
    """The steps of ``kernel`` (by index) to run as loops; ``csr``: the arguments that are CSR
    blocks (read by the loops that take X sparse; any other rewrite of them is left out)."""
    loops = _loops()
    if loops is None:
        return {}
    n_args, steps = kernel.n_args, kernel.steps
    found: dict[int, Rewrite] = {}
    onehots = {n_args + i: pair for i, step in enumerate(steps)
               if (pair := _one_hot(kernel, n_args + i, shapes, dtypes)) is not None}
    for i, step in enumerate(steps):
        slot = n_args + i
        attrs = step.attrs
        if attrs in (Reduce("argmin", (1,), True), Reduce("argmax", (1,), True)) \
                and len(shapes[step.inputs[0]]) == 2 and dtypes[step.inputs[0]] == "float64" \
                and shapes[step.inputs[0]][1] <= SHORT_ROW:
            source = step.inputs[0]
            nearest = _nearest(kernel, source, shapes, dtypes) if attrs.fn == "argmin" else None
            if nearest is not None:
                (x, c, a), scale, transposed = nearest
                subscripts = "rm,mc,c->rz" if transposed else "rm,cm,c->rz"
                run = functools.partial(_nearest_rows, loops, (x, c, a), scale, transposed, x in csr)
                found[i] = Rewrite((x, c, a), subscripts, run, "nearest_rows", scale, transposed,
                                   (x,) if x in csr else ())
                continue
            loop = loops.argmin_rows if attrs.fn == "argmin" else loops.argmax_rows
            found[i] = Rewrite((source,), "rk->rz", functools.partial(_row_loop, loop, source))
            continue
        if dtypes[slot] != "float64":
            continue
        if attrs == Reduce("sum", (0,), False) and step.inputs[0] in onehots:
            labels, ids = onehots[step.inputs[0]]
            found[i] = Rewrite((labels, ids), "rz,c->c", _call(loops.count, labels, ids), "count")
        elif isinstance(attrs, Einsum) and len(step.inputs) == 2 and step.inputs[0] in onehots:
            labels, ids = onehots[step.inputs[0]]
            other = step.inputs[1]
            if len(shapes[other]) != 2 or dtypes[other] != "float64":
                continue
            terms, out = attrs.subscripts.split("->")
            e_term, o_term = terms.split(",")  # E's labels, the other operand's
            (e_row, e_col), (o_row, o_col) = tuple(e_term), tuple(o_term)
            if e_row == o_row and o_col not in (e_row, e_col) and out == e_col + o_col:  # Eᵀ @ X: rows summed per group
                if other in csr:
                    found[i] = Rewrite((labels, ids, other), "rz,c,rm->cm", _call_csr(loops.group_sum_csr, labels, ids,
                                                                                      other), "group_sum", csr=(other,))
                    continue
                found[i] = Rewrite((labels, ids, other), "rz,c,rm->cm", _call(loops.group_sum, labels, ids, other),
                                   "group_sum")
            elif e_col == o_row and o_col not in (e_row, e_col) and out == e_row + o_col:  # E @ C: each row's group row
                found[i] = Rewrite((labels, ids, other), "rz,c,cm->rm", _call(loops.gather, labels, ids, other))
    return found


def packed(kernel: Any, found: dict[int, Rewrite], shapes: Sequence[tuple[int, ...]]) -> list[Packed]:
    """Rewritten steps one loop can do together: the sums per group of X's rows and their
    counts, when the groups are X's nearest rows of C (k-means' step), as one pass over X
    (``loops.nearest_group_sums``) instead of the assignment, the sums and the counts apart.
    The assignment's own rewrite stays for any other reader of the labels (else it is dead).
    As with ``group_sum``, a NaN in X reaches only its own group's sum (the product would
    spread 0 · NaN to every group); jobs refuse NaN input before any of this runs."""
    nearest = {kernel.n_args + i: r for i, r in found.items() if r.loop == "nearest_rows"}
    if not nearest:  # nothing to pack: no numba import in this process (see LOOP_MIN_BYTES)
        return []
    loops, packs, taken = _loops(), [], set()
    packs.extend(_nearest_and_least(kernel, found, shapes, loops))
    for i, r in found.items():
        if r.loop != "group_sum" or r.inputs[0] not in nearest or nearest[r.inputs[0]].inputs[0] != r.inputs[2]:
            continue
        labels, ids, x = r.inputs
        near, d = nearest[labels], shapes[x][1]
        counts = [j for j, q in found.items() if q.loop == "count" and q.inputs == (labels, ids) and j not in taken]
        taken.update(counts)
        parts: dict[int, Callable[[Any], Any]] = {i: functools.partial(_leading_columns, d)}
        parts.update({j: functools.partial(_column, d) for j in counts})
        _, c, a = near.inputs
        run = functools.partial(_nearest_group_sums, loops, (x, c, a, ids), near.scale, near.transposed, bool(near.csr))
        subscripts = "rm,mc,c,k->kM" if near.transposed else "rm,cm,c,k->kM"
        packs.append(Packed((x, c, a, ids), subscripts, run, (shapes[ids][0], d + 1), parts))
    return packs


def _nearest_and_least(kernel: Any, found: dict[int, Rewrite], shapes: Sequence[tuple[int, ...]],
                       loops: Any) -> list[Packed]:
    """The nearest rows of C over a CSR X and the least score of each row, when the program
    wants both (k-means' final pass: its labels, and an inertia that sums the least scores):
    one loop (``loops.nearest_rows_min_csr``) gives [label | least score] per row, and the
    n × k scores are never made. One 500,000-row block of 2^16 columns, k = 16, one thread:
    the loop 122 ms, the scores as a SciPy product with their argmin and min 213 ms
    (``benchmarks/bench_micro.py sparse-kmeans``)."""
    packs: list[Packed] = []
    for i, r in found.items():
        if r.loop != "nearest_rows" or not r.csr:
            continue
        source = kernel.steps[i].inputs[0]
        least = [j for j, step in enumerate(kernel.steps)
                 if step.inputs == (source,) and step.attrs in (Reduce("min", (1,), False), Reduce("min", (1,), True))]
        if not least:
            continue
        n = shapes[source][0]
        parts: dict[int, Callable[[Any], Any]] = {i: _labels_of}
        parts.update({j: functools.partial(_least_of, kernel.steps[j].attrs.keepdims) for j in least})
        x, c, a = r.inputs
        run = functools.partial(_nearest_rows, loops, (x, c, a), r.scale, r.transposed, True, least=True)
        packs.append(Packed(r.inputs, "rm,mc,c->rz" if r.transposed else "rm,cm,c->rz", run, (n, 2), parts))
    return packs


def _labels_of(packed: Any) -> Any:
    return packed[:, :1].astype(np.int64)


def _least_of(keepdims: bool, packed: Any) -> Any:
    return packed[:, 1:2].copy() if keepdims else packed[:, 1].copy()


def _one_hot(kernel: Any, slot: int, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str],
             ) -> tuple[int, int] | None:
    """(labels slot, ids slot) when ``slot`` is ``(labels == ids) * 1`` with labels (n, 1), ids (k,)."""
    n_args = kernel.n_args
    step = kernel.steps[slot - n_args]
    if step.attrs != Map("multiply") or dtypes[slot] != "float64" or len(shapes[slot]) != 2:
        return None
    for mask, one in (step.inputs, step.inputs[::-1]):
        if one < n_args or mask < n_args:
            continue
        const, equal = kernel.steps[one - n_args], kernel.steps[mask - n_args]
        if const.attrs != Const(1) or equal.attrs != Map("equal"):
            continue
        labels, ids = equal.inputs
        if len(shapes[labels]) == 2 and shapes[labels][1] == 1 and dtypes[labels].startswith("int") \
                and len(shapes[ids]) == 1 and shapes[ids][0] == shapes[slot][1] \
                and shapes[labels][0] == shapes[slot][0]:
            return labels, ids
    return None


def _nearest(kernel: Any, slot: int, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str],
             ) -> tuple[tuple[int, int, int], float, bool] | None:
    """((X, C, a) slots, s, transposed) when ``slot`` is ``a - s * einsum("ij,kj->ik", X, C)``
    (or with ``s`` on the right of the product), X (n, d), C (k, d), a (k,), all float64; or
    ``einsum("ij,jk->ik", X, C)`` with C held transposed, (d, k) (``transposed``)."""
    n_args = kernel.n_args

    def step(s: int) -> Any:
        return kernel.steps[s - n_args] if s >= n_args else None

    sub = step(slot)
    if sub is None or sub.attrs != Map("subtract"):
        return None
    a, scaled = sub.inputs
    mul = step(scaled)
    if mul is None or mul.attrs != Map("multiply"):
        return None
    for const, product in (mul.inputs, mul.inputs[::-1]):
        k_step, p_step = step(const), step(product)
        if k_step is None or not isinstance(k_step.attrs, Const) or p_step is None \
                or p_step.attrs not in (Einsum("ij,kj->ik"), Einsum("ij,jk->ik")) or len(p_step.inputs) != 2:
            continue
        x, c = p_step.inputs
        transposed = p_step.attrs == Einsum("ij,jk->ik")
        if len(shapes[x]) == 2 and len(shapes[c]) == 2 and shapes[x][1] == shapes[c][1 - transposed] \
                and shapes[a] == (shapes[c][transposed],) and all(dtypes[s] == "float64" for s in (x, c, a)):
            return (x, c, a), float(k_step.attrs.value), transposed
    return None


def _centroids(C: Any, transposed: bool, want_transposed: bool) -> np.ndarray:
    """C as a loop reads it: (k, d) rows for a dense X, (d, k) for a CSR one, its start on a
    cache line (64 bytes), where Ray's object store puts it: the CSR loops read a row of Cᵀ as
    vectors of 8 doubles, and a vector split over two lines makes k-means' step a fifth to a third
    slower (``bench_micro.py sparse-kmeans``: 16 bytes off a cache line and on one)."""
    C = np.asarray(C, dtype=np.float64)
    C = np.ascontiguousarray(C.T if transposed != want_transposed else C)
    if C.ctypes.data % CACHE_LINE == 0:
        return C
    room = np.empty(C.nbytes + CACHE_LINE, dtype=np.uint8)
    start = -room.ctypes.data % CACHE_LINE
    aligned = room[start: start + C.nbytes].view(np.float64).reshape(C.shape)
    aligned[...] = C
    return aligned


def _nearest_rows(loops: Any, slots: tuple[int, int, int], scale: Any, transposed: bool, csr: bool,
                  vals: list[Any], least: bool = False) -> Any:
    """Each row's nearest row of C; with ``least`` (CSR only), [label | least score] per row."""
    x, c, a = slots
    C, offsets = _centroids(vals[c], transposed, csr), np.ascontiguousarray(vals[a], dtype=np.float64)
    if csr:
        Xd, Xi, Xp, _ = CSRRows().arguments(vals[x])
        loop = loops.nearest_rows_min_csr if least else loops.nearest_rows_csr
        return loop(Xd, Xi, Xp, C, offsets, scale)
    return loops.nearest_rows(np.ascontiguousarray(vals[x], dtype=np.float64), C, offsets, scale)


def _nearest_group_sums(loops: Any, slots: tuple[int, int, int, int], scale: float, transposed: bool, csr: bool,
                        vals: list[Any]) -> Any:
    x, c, a, ids = slots
    C, offsets = _centroids(vals[c], transposed, csr), np.ascontiguousarray(vals[a], dtype=np.float64)
    groups = np.ascontiguousarray(vals[ids], dtype=np.float64)
    if csr:
        return loops.nearest_group_sums_csr(*CSRRows().arguments(vals[x]), C, offsets, scale, groups)
    return loops.nearest_group_sums(np.ascontiguousarray(vals[x], dtype=np.float64), C, offsets, scale, groups)


def _row_loop(loop: Callable[..., Any], slot: int, vals: list[Any]) -> Any:
    return loop(np.ascontiguousarray(vals[slot]))


def _leading_columns(d: int, packed: Any) -> Any:
    return np.ascontiguousarray(packed[:, :d])


def _column(d: int, packed: Any) -> Any:
    return packed[:, d].copy()


def _call_csr(loop: Callable[..., Any], labels: int, ids: int, x: int) -> Callable[[list[Any]], Any]:
    """``_call`` with its last argument a CSR block, passed as ``CSRRows`` reads it."""
    def run(vals: list[Any]) -> Any:
        return loop(np.ascontiguousarray(vals[labels][:, 0]), np.ascontiguousarray(vals[ids], dtype=np.float64),
                    *CSRRows().arguments(vals[x]))

    return run


def _call(loop: Callable[..., Any], *slots: int) -> Callable[[list[Any]], Any]:
    def run(vals: list[Any]) -> Any:
        labels, *rest = (vals[s] for s in slots)
        return loop(np.ascontiguousarray(labels[:, 0]), *(np.ascontiguousarray(v, dtype=np.float64) for v in rest))

    return run


@functools.cache
def _loops() -> Any:
    """The compiled loops (``loops``, numba), or None without numba."""
    try:
        from arrayjob.kernels import loops
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    return loops
