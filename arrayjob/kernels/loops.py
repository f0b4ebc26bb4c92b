"""The loops behind ``rewrites``, compiled by numba (cached on disk, nogil).

``labels`` is int64 (n,), ``ids`` float64 (k,); a row counts for every j with
``labels[i] == ids[j]``, exactly as a product with ``(labels[:, None] == ids) * 1.0`` does.

The k dot products of a sparse row with k centroids (k-means) hold their sums in vector
registers (``row_dots``, an intrinsic written in LLVM IR): written as a loop over j, numba's
LLVM vectorises it for long k only (32 lanes a step), so at the k = 8–39 of k-means the sums
ran one double at a time, kept in memory. ``row_dots`` keeps 8⌊k/8⌋ sums as vectors of 8
doubles for the whole row: one multiply-add per 8 centroids per non-zero, in the row's order,
fused where the CPU fuses the scalar loop's (LLVM's ``fmuladd``, what numba's ``contract``
gives it), so every lane adds exactly what the scalar loop adds, from 0.0: the same bits. It
lives in this file because numba's on-disk cache of a loop is checked against the loop's own
file only.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

jit = numba.njit(cache=True, nogil=True)


@jit
def started(x):
    """Nothing: its first call starts numba in a process (``kernels.start_loops``)."""
    return x


@jit
def group_sum(labels, ids, X):
    """Σ over rows i with labels[i] == ids[j] of X[i]: (k, d)."""
    n, d = X.shape
    out = np.zeros((ids.shape[0], d))
    for i in range(n):
        for j in range(ids.shape[0]):
            if labels[i] == ids[j]:
                for c in range(d):
                    out[j, c] += X[i, c]
    return out


@jit
def count(labels, ids):
    """How many rows have labels[i] == ids[j]: (k,)."""
    out = np.zeros(ids.shape[0])
    for i in range(labels.shape[0]):
        for j in range(ids.shape[0]):
            if labels[i] == ids[j]:
                out[j] += 1.0
    return out


@jit
def gather(labels, ids, C):
    """Row i: Σ over j with labels[i] == ids[j] of C[j]: (n, m)."""
    m = C.shape[1]
    out = np.zeros((labels.shape[0], m))
    for i in range(labels.shape[0]):
        for j in range(ids.shape[0]):
            if labels[i] == ids[j]:
                for c in range(m):
                    out[i, c] += C[j, c]
    return out


@numba.njit(inline="always")
def _argmin(row):
    """NumPy's argmin of a 1-D float64 row: the first minimum, or the first NaN."""
    best, v = 0, row[0]
    if v == v:
        for j in range(1, row.shape[0]):
            x = row[j]
            if x != x:
                return j
            if x < v:
                best, v = j, x
    return best


@jit
def argmin_rows(S):
    """NumPy's ``S.argmin(axis=1, keepdims=True)`` for a 2-D float64 S (the first NaN wins)."""
    n = S.shape[0]
    out = np.zeros((n, 1), dtype=np.int64)
    for i in range(n):
        out[i, 0] = _argmin(S[i])
    return out


@jit
def argmax_rows(S):
    """NumPy's ``S.argmax(axis=1, keepdims=True)`` for a 2-D float64 S (the first NaN wins)."""
    n, k = S.shape
    out = np.zeros((n, 1), dtype=np.int64)
    for i in range(n):
        best, v = 0, S[i, 0]
        if v == v:
            for j in range(1, k):
                x = S[i, j]
                if x != x:
                    best = j
                    break
                if x > v:
                    best, v = j, x
        out[i, 0] = best
    return out


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def nearest_rows(X, C, a, scale):
    """``(a - scale * X @ C.T).argmin(axis=1, keepdims=True)`` without the n × k scores: per
    row, k dot products (vectorised: the sums may be reassociated, as BLAS does) into a
    k-long buffer, then its argmin (the first NaN wins, as in NumPy)."""
    n, d = X.shape
    k = C.shape[0]
    out = np.zeros((n, 1), dtype=np.int64)
    scores = np.empty(k)
    for i in range(n):
        for j in range(k):
            acc = 0.0
            for c in range(d):
                acc += X[i, c] * C[j, c]
            scores[j] = a[j] - scale * acc
        out[i, 0] = _argmin(scores)
    return out


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def nearest_group_sums(X, C, a, scale, ids):
    """K-means' step in one pass over X: each row's nearest row of C, as ``nearest_rows``
    picks it, then Σ of X's rows and their count per id — ``[Eᵀ @ X | E.sum(0)]`` for
    ``E = (nearest == ids) * 1``, packed as (len(ids), d + 1). Rows go in fours so each row
    of C is loaded once for four rows, whose dot products are independent: one 500,000 × 64
    block, k = 8, one thread: 30.6 ms of CPU against 33.7 in pairs and 43 in eights (more
    accumulators than registers); ``benchmarks/bench_micro.py kmeans-assign`` times the loop."""
    n, d = X.shape
    k = C.shape[0]
    per = np.zeros((k, d + 1))  # sums and counts per row of C
    s0, s1, s2, s3 = np.empty(k), np.empty(k), np.empty(k), np.empty(k)
    fours = n - n % 4
    for i in range(0, fours, 4):
        for j in range(k):
            acc0, acc1, acc2, acc3 = 0.0, 0.0, 0.0, 0.0
            for c in range(d):
                cj = C[j, c]
                acc0 += X[i, c] * cj
                acc1 += X[i + 1, c] * cj
                acc2 += X[i + 2, c] * cj
                acc3 += X[i + 3, c] * cj
            s0[j] = a[j] - scale * acc0
            s1[j] = a[j] - scale * acc1
            s2[j] = a[j] - scale * acc2
            s3[j] = a[j] - scale * acc3
        _add_row(per, _argmin(s0), X[i])
        _add_row(per, _argmin(s1), X[i + 1])
        _add_row(per, _argmin(s2), X[i + 2])
        _add_row(per, _argmin(s3), X[i + 3])
    for i in range(fours, n):
        for j in range(k):
            acc0 = 0.0
            for c in range(d):
                acc0 += X[i, c] * C[j, c]
            s0[j] = a[j] - scale * acc0
        _add_row(per, _argmin(s0), X[i])
    out = np.zeros((ids.shape[0], d + 1))
    for j in range(ids.shape[0]):  # ids may repeat or miss rows of C, as in the product
        for b in range(k):
            if b == ids[j]:
                out[j] += per[b]
    return out


@numba.njit(inline="always")
def _add_row(per, best, row):
    d = row.shape[0]
    for c in range(d):
        per[best, c] += row[c]
    per[best, d] += 1.0


LANES = 8  # doubles in a vector (512 bits; LLVM splits it where the CPU's vectors are narrower)
MOST = 4  # vectors a row may hold: k up to 39 (a longer k vectorises as a loop over j)


@intrinsic
def row_dots(typingctx: Any, Xd: Any, Xi: Any, lo: Any, hi: Any, CT: Any, scores: Any, vectors: Any) -> Any:
    """``scores[j] = Σ_{lo ≤ p < hi} Xd[p] · CT[Xi[p], j]`` for j < 8 × ``vectors`` (a literal),
    each in p order from 0.0. CT is (d, k), its rows 8-byte strided (contiguous) with k ≥ 8 ×
    ``vectors``; Xi's values are valid rows of CT (the reader checked them)."""
    if not isinstance(vectors, types.IntegerLiteral) or not 1 <= vectors.literal_value <= MOST:
        return None
    count = vectors.literal_value

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        xd, xi, lo_v, hi_v, ct, out, _ = args
        i64, vec = ir.IntType(64), ir.VectorType(ir.DoubleType(), LANES)
        values = context.make_array(signature.args[0])(context, builder, xd).data
        columns = context.make_array(signature.args[1])(context, builder, xi).data
        centroids = context.make_array(signature.args[4])(context, builder, ct)
        row_bytes = builder.extract_value(centroids.strides, 0)
        base = builder.bitcast(centroids.data, ir.IntType(8).as_pointer())
        sums = context.make_array(signature.args[5])(context, builder, out).data
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), "llvm.fmuladd.v8f64")

        def wide(value: Any, signed: bool) -> Any:
            if value.type.width == 64:
                return value
            return builder.sext(value, i64) if signed else builder.zext(value, i64)

        start, stop = wide(lo_v, signature.args[2].signed), wide(hi_v, signature.args[3].signed)
        entry = builder.block
        header = builder.append_basic_block("row_dots.header")
        body = builder.append_basic_block("row_dots.body")
        done = builder.append_basic_block("row_dots.done")
        builder.branch(header)

        builder.position_at_end(header)
        p = builder.phi(i64)
        p.add_incoming(start, entry)
        acc = [builder.phi(vec) for _ in range(count)]
        for a in acc:
            a.add_incoming(ir.Constant(vec, [0.0] * LANES), entry)
        builder.cbranch(builder.icmp_signed("<", p, stop), body, done)

        builder.position_at_end(body)
        v = builder.load(builder.gep(values, [p]))
        c = wide(builder.load(builder.gep(columns, [p])), signature.args[1].dtype.signed)
        splat = builder.shuffle_vector(
            builder.insert_element(ir.Constant(vec, ir.Undefined), v, ir.Constant(ir.IntType(32), 0)),
            ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))
        row = builder.bitcast(builder.gep(base, [builder.mul(c, row_bytes)]), vec.as_pointer())
        added = [builder.call(fma, [splat, builder.load(builder.gep(row, [ir.Constant(i64, m)]), align=8), a])
                 for m, a in enumerate(acc)]
        p.add_incoming(builder.add(p, ir.Constant(i64, 1)), builder.block)
        for a, new in zip(acc, added, strict=True):
            a.add_incoming(new, builder.block)
        builder.branch(header)

        builder.position_at_end(done)
        target = builder.bitcast(sums, vec.as_pointer())
        for m, a in enumerate(acc):
            builder.store(a, builder.gep(target, [ir.Constant(i64, m)]), align=8)
        return context.get_dummy_value()

    return types.void(Xd, Xi, lo, hi, CT, scores, vectors), codegen


# -- over CSR row blocks (``row_layouts.CSRRows``: values Xd, unsigned column indices Xi, row
# pointers Xp): the same loops visiting the non-zeros only. C is held transposed, (d, k), so
# that the centroids' values at one non-zero's column are k contiguous floats.


@numba.njit(inline="always")
def _csr_scores(Xd, Xi, Xp, i, CT, a, scale, scores):
    """scores[j] = a[j] - scale * x_i·C[j] for row i, over its non-zeros in order (SciPy's).
    For 8 ≤ k < 40 the first 8⌊k/8⌋ dot products run in vector registers (``row_dots``,
    the same bits), the rest one at a time; a longer k as one loop over j, which LLVM
    vectorises itself."""
    k = CT.shape[1]
    lo, hi = np.int64(Xp[i]), np.int64(Xp[i + 1])
    held = 0
    if CT.strides[1] == 8 and 8 <= k < 8 * (MOST + 1):
        if k >= 32:
            row_dots(Xd, Xi, lo, hi, CT, scores, 4)
            held = 32
        elif k >= 24:
            row_dots(Xd, Xi, lo, hi, CT, scores, 3)
            held = 24
        elif k >= 16:
            row_dots(Xd, Xi, lo, hi, CT, scores, 2)
            held = 16
        else:
            row_dots(Xd, Xi, lo, hi, CT, scores, 1)
            held = 8
        for j in range(held, k):
            s = 0.0
            for p in range(lo, hi):
                s += Xd[p] * CT[Xi[p], j]
            scores[j] = s
    else:
        for j in range(k):
            scores[j] = 0.0
        for p in range(lo, hi):
            v, c = Xd[p], Xi[p]
            for j in range(k):
                scores[j] += v * CT[c, j]
    for j in range(k):
        scores[j] = a[j] - scale * scores[j]


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def nearest_rows_csr(Xd, Xi, Xp, CT, a, scale):
    """``nearest_rows`` over a CSR block, C given as Cᵀ (d, k)."""
    n = Xp.shape[0] - 1
    out = np.zeros((n, 1), dtype=np.int64)
    scores = np.empty(CT.shape[1])
    for i in range(n):
        _csr_scores(Xd, Xi, Xp, i, CT, a, scale, scores)
        out[i, 0] = _argmin(scores)
    return out


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def nearest_rows_min_csr(Xd, Xi, Xp, CT, a, scale):
    """``nearest_rows_csr`` and each row's least score (the score of its label: NaN where
    NumPy's argmin picks a NaN, as ``min`` gives), packed as (n, 2) floats: k-means' final
    pass, whose inertia sums the least scores, in one visit and with no n × k scores."""
    n = Xp.shape[0] - 1
    out = np.zeros((n, 2))
    scores = np.empty(CT.shape[1])
    for i in range(n):
        _csr_scores(Xd, Xi, Xp, i, CT, a, scale, scores)
        best = _argmin(scores)
        out[i, 0] = best
        out[i, 1] = scores[best]
    return out


@numba.njit(cache=True, nogil=True)
def group_sum_csr(labels, ids, Xd, Xi, Xp, d):
    """``group_sum`` over a CSR block: Σ over rows i with labels[i] == ids[j] of X[i], (k, d)."""
    out = np.zeros((ids.shape[0], d))
    for i in range(Xp.shape[0] - 1):
        for j in range(ids.shape[0]):
            if labels[i] == ids[j]:
                for p in range(Xp[i], Xp[i + 1]):
                    out[j, Xi[p]] += Xd[p]
    return out


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def nearest_group_sums_csr(Xd, Xi, Xp, d, CT, a, scale, ids):
    """``nearest_group_sums`` over a CSR block in two sweeps of its non-zeros: each row's k dot
    products with Cᵀ's rows at its columns and their argmin, then each row's values added into
    its centroid's sums, and its count. Two sweeps, each with its reads independent and many in
    flight, beat one that alternates a row's dot products with its scattered adds (timed by hand
    on random columns, when the sweeps were split: about a third less). The sums are added in
    the same order either way."""
    k, n = CT.shape[1], Xp.shape[0] - 1
    labels = np.empty(n, dtype=np.int64)
    scores = np.empty(k)
    for i in range(n):
        _csr_scores(Xd, Xi, Xp, i, CT, a, scale, scores)
        labels[i] = _argmin(scores)
    per = np.zeros((k, d + 1))
    for i in range(n):
        sums = per[labels[i]]
        for p in range(np.int64(Xp[i]), np.int64(Xp[i + 1])):
            sums[Xi[p]] += Xd[p]
        sums[d] += 1.0
    if ids.shape[0] == k and (ids == np.arange(k)).all():
        return per  # k-means' own ids: no (k, d) copy per block
    out = np.zeros((ids.shape[0], d + 1))
    for j in range(ids.shape[0]):
        for b in range(k):
            if b == ids[j]:
                out[j] += per[b]
    return out
