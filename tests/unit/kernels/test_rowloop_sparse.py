"""Row loops over CSR blocks (``kernels/row_layouts.CSRRows``): the loop visits the
non-zeros only and agrees with the dense NumPy evaluation of the same program."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from arrayjob import kernels
from arrayjob import lazy as la
from arrayjob.kernels import compiler, rowloop
from arrayjob.kernels.block_kernel import CompiledPrograms
from arrayjob.kernels.row_layouts import CSCColumns, CSRRows, DenseRows
from arrayjob.planner.ops import Einsum
from tests.harness.helpers import block_kernel

N, D, PER_ROW = 5000, 20_000, 20
EMPTY_EVERY = 7  # every 7th row has no non-zeros


def _csr(dtype: str, index: str, seed: int = 3) -> sp.csr_matrix:
    """N × D, PER_ROW entries a row at columns drawn with repeats and unsorted (SciPy sums
    repeated entries; the loop must too), every EMPTY_EVERY-th row empty, and the first 50
    rows' margins far into exp's overflow."""
    rng = np.random.default_rng(seed)
    counts = np.full(N, PER_ROW)
    counts[::EMPTY_EVERY] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)])
    data = rng.standard_normal(indptr[-1])
    data[: indptr[50]] *= 1e3
    X = sp.csr_matrix((data.astype(dtype), rng.integers(0, D, indptr[-1]), indptr), shape=(N, D))
    X.indices, X.indptr = X.indices.astype(index), X.indptr.astype(index)  # SciPy narrows them
    assert X.indices.dtype == index and X.data.dtype == dtype and not X.has_sorted_indices
    return X


def _data(X: sp.csr_matrix) -> dict[str, object]:
    rng = np.random.default_rng(5)
    return {"X": X, "w": rng.standard_normal(D), "y": (rng.random(N) > 0.5) * 1.0, "b": np.float64(0.25)}


def _logistic(n=N, d=D):
    """The logistic loss and its gradient (``jobs/logreg.py``), as ``test_rowloop`` has it."""
    x, y, w, b = la.value("X", (n, d)), la.value("y", (n,)), la.value("w", (d,)), la.value("b", ())
    sign = 2.0 * y - 1.0
    margin = sign * (x @ w + b)
    dz = -sign * la.sigmoid(-margin)
    return [la.sum(la.logaddexp(0.0, -margin)), x.T @ dz, la.sum(dz)]


def _least_squares():
    """Linear regression's gradient Xᵀ(Xw − y), and its loss."""
    x, y, w = la.value("X", (N, D)), la.value("y", (N,)), la.value("w", (D,))
    r = x @ w - y
    return [x.T @ r, la.sum(r * r)]


def _program(outputs, values):
    kernel, args = block_kernel(outputs, values)
    program = compiler.Program(kernel, args)
    (carrier,) = program.sparse
    return kernel, args, program, carrier


def _run_loop(outputs, values):
    """The outputs of the row loop over the sparse block (CSR: one pass over the rows; CSC:
    two sweeps over the columns), called directly (not through the compiler's size rule)."""
    kernel, args, program, carrier = _program(outputs, values)
    run = rowloop.build(program, carrier)
    assert run is not None
    vals = list(args) + [None] * (len(program.shapes) - len(args))
    with np.errstate(all="ignore"):
        run(vals)
    return [vals[o] for o in kernel.outputs]


def _dense_reference(outputs, values, rows=1000):
    """The program on NumPy step by step (``kernels.interpret``) with X dense, 1,000 rows at a
    time (every output is a sum over the rows) so no N × D array is made at once. Made dense
    in float64, as NumPy's products with w take it: ``toarray`` would round the sum of a
    row's repeated float32 entries to float32, where SciPy's product and the loop do not."""
    kernel, args = block_kernel(outputs, values)
    X = values["X"]
    carrier = next(a for a, v in enumerate(args) if v is X)
    total = None
    for lo in range(0, N, rows):
        piece = [X[lo:lo + rows].astype(np.float64).toarray() if a == carrier else v[lo:lo + rows] if np.ndim(v) and len(v) == N else v
                 for a, v in enumerate(args)]
        with np.errstate(all="ignore"):
            got = kernels.interpret(kernel, *piece)
        got = list(got) if isinstance(got, tuple) else [got]
        total = got if total is None else [t + g for t, g in zip(total, got, strict=True)]
    assert total is not None
    return total


def _assert_close(got, want):
    # relative to each output's largest entry: a gradient entry summed from terms of both signs
    # has an error relative to its terms, not to itself
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * np.abs(w).max())
        assert np.shape(g) == np.shape(w)


@pytest.mark.parametrize("held", ["csr", "csc"])
@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("program", [_logistic, _least_squares])
def test_the_loop_over_non_zeros_equals_the_dense_evaluation(program, dtype, index, held):
    values = _data(_csr(dtype, index))
    block = values["X"].asformat(held)
    block.indices, block.indptr = block.indices.astype(index), block.indptr.astype(index)
    _assert_close(_run_loop(program(), values | {"X": block}), _dense_reference(program(), values))


@pytest.mark.parametrize(("layout", "as_block"), [(DenseRows, sp.csr_matrix.toarray), (CSRRows, sp.csr_matrix.tocsr),
                                               (CSCColumns, sp.csr_matrix.tocsc)], ids=["dense", "csr", "csc"])
def test_every_layout_makes_the_same_loop_of_one_program(layout, as_block):
    n, d = 300, 40
    X = sp.random(n, d, density=0.2, format="csr", random_state=2)
    rng = np.random.default_rng(2)
    values = {"X": as_block(X), "w": rng.standard_normal(d), "y": (rng.random(n) > 0.5) * 1.0, "b": np.float64(0.1)}
    kernel, args = block_kernel(_logistic(n, d), values)
    carrier = next(a for a, v in enumerate(args) if v is values["X"])
    loop = rowloop._RowLoop(compiler.Program(kernel, args), carrier)
    assert type(loop.layout) is layout
    vals = list(args) + [None] * len(kernel.steps)
    loop.runner()(vals)
    want = kernels.interpret(kernel, *[X.toarray() if a == carrier else v for a, v in enumerate(args)])
    _assert_close([vals[o] for o in kernel.outputs], want)


def test_a_csc_block_is_read_by_columns_and_agrees_with_the_loop_over_rows():
    values = _data(_csr("float64", "int32"))
    want = _run_loop(_logistic(), values)
    C = values["X"].tocsc()
    _, _, program, carrier = _program(_logistic(), values | {"X": C})
    assert type(rowloop._RowLoop(program, carrier).layout) is CSCColumns
    got = _run_loop(_logistic(), values | {"X": C})
    _assert_close(got, want)


def test_the_loop_over_a_csc_block_sweeps_its_columns_twice_around_the_rows():
    """X @ w made by a sweep over the columns into an n-vector, the steps per row, Xᵀ @ dz by a
    second sweep that writes each gradient entry once: nothing of X's dense shape."""
    values = _data(_csr("float64", "int32"))
    _, _, program, carrier = _program(_logistic(), values | {"X": values["X"].tocsc()})
    tree = rowloop._RowLoop(program, carrier).tree()
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "row_loop")
    assert [a.arg for a in function.args.args][:4] == ["Xd", "Xi", "Xp", "n"]
    loops = [s for s in function.body if isinstance(s, ast.For)]
    assert [ast.unparse(s.iter) for s in loops] == ["range(d)", "range(n)", "range(d)"]
    first, _, second = loops
    assert re.fullmatch(r"t\d+_rows\[Xi\[k\]\] \+= Xd\[k\] \* p\d+\[c\]", ast.unparse(first.body[0].body))
    assert re.search(r"t\d+_c \+= Xd\[k\] \* t\d+_rows\[Xi\[k\]\]", ast.unparse(second))
    names = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
    assert "X" not in names


def test_the_generated_loop_visits_the_non_zeros_of_each_row():
    _, _, program, carrier = _program(_logistic(), _data(_csr("float64", "int32")))
    tree = rowloop._RowLoop(program, carrier).tree()
    compile(tree, "<row loop>", "exec")
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "row_loop")
    assert [a.arg for a in function.args.args][:4] == ["Xd", "Xi", "Xp", "d"]
    (rows,) = [s for s in function.body if isinstance(s, ast.For)]
    inner = [s for s in rows.body if isinstance(s, ast.For)]
    assert [ast.unparse(s.iter) for s in inner] == ["range(Xp[i], Xp[i + 1])"] * 2
    dot, scatter = (ast.unparse(s.body) for s in inner)
    assert re.fullmatch(r"t\d+ \+= Xd\[k\] \* p\d+\[Xi\[k\]\]", dot)  # X @ w
    assert re.fullmatch(r"t\d+\[Xi\[k\]\] \+= Xd\[k\] \* t\d+", scatter)  # Xᵀ @ dz
    names = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
    assert "X" not in names  # nothing of X's dense shape is read


def test_elementwise_steps_on_x_are_no_row_loop():
    x, w = la.value("X", (N, D)), la.value("w", (D,))
    values = _data(_csr("float64", "int32"))
    _, _, program, carrier = _program([(x * x).sum(axis=0), x.T @ (x @ w)], values)
    assert rowloop.build(program, carrier) is None
    assert program.row_loop is None


@pytest.mark.parametrize("held", ["csr", "csc"])
def test_the_compiler_takes_the_loop_for_a_sparse_block_of_any_dense_size(held, monkeypatch):
    monkeypatch.setattr(compiler, "LOOP_MIN_BYTES", 2**62)  # whatever the dense rule says
    X = _csr("float64", "int32").asformat(held)
    stored = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", stored)
    kernel, args, program, _ = _program(_logistic(), _data(X))
    assert program.row_loop is not None and program.chunking is None
    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", stored + 1)  # a tiny block: SciPy's calls
    assert compiler.Program(kernel, args).row_loop is None


def test_a_sparse_argument_is_no_leaf_of_a_numexpr_expression():
    n, d = 300, 40  # 12,000 elements: an expression, were X dense
    x = la.value("X", (n, d))
    X = sp.random(n, d, density=0.1, format="csr", random_state=0)
    expressions = []
    for block in (X.toarray(), X):
        kernel, args = block_kernel([la.exp(x * 2.0).sum(axis=0)], {"X": block})
        program = compiler.Program(kernel, args)
        expressions.append([op.expression for op in program.ops if op.expression])
    assert expressions[0] and not expressions[1]


def test_a_sparse_and_a_dense_block_of_one_shape_are_two_programs():
    n, d = 300, 40
    X = sp.random(n, d, density=0.1, format="csr", random_state=0)
    values = {"X": X, "w": np.ones(d), "y": np.ones(n), "b": np.float64(0.0)}
    kernel, args = block_kernel(_logistic(n, d), values)
    dense = [X.toarray() if a is X else a for a in args]
    programs = CompiledPrograms()
    assert programs.get(kernel, tuple(args)) is not programs.get(kernel, tuple(dense))
    assert programs.get(kernel, tuple(args)).sparse and not programs.get(kernel, tuple(dense)).sparse


@pytest.mark.parametrize("program", [_logistic, _least_squares])
def test_past_the_loop_scipy_products_never_make_x_dense(program, monkeypatch):
    """A block the loop does not take (too small) runs as SciPy
    calls: X @ w and Xᵀ dz are sparse products. Folding w into X as a column scaling left X
    alone in its contraction, made dense (a 5,000 × 2^20 block asked for 39 GiB)."""
    from arrayjob.kernels import sparse

    def dense(x):
        assert not sparse.issparse(x), f"a {x.shape} sparse block made dense"
        return np.asarray(x)

    monkeypatch.setattr(sparse, "dense", dense)
    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 2**62)
    values = _data(_csr("float64", "int32"))
    kernel, args = block_kernel(program(), values)
    compiled = compiler.Program(kernel, args)
    assert compiled.row_loop is None
    with np.errstate(all="ignore"):
        got = compiled(args)
    _assert_close(got, _dense_reference(program(), values))


# -- k-means over CSR blocks: the nearest centroid, the sums and counts in one visit ----------


def _integer_csr(n: int, d: int, index: str, seed: int = 4) -> sp.csr_matrix:
    """Small integer values (exact sums in any order, so ties are exact), repeated and unsorted
    columns, every EMPTY_EVERY-th row empty."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, n)
    counts[::EMPTY_EVERY] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)])
    X = sp.csr_matrix((rng.integers(-3, 4, indptr[-1]).astype(float), rng.integers(0, d, indptr[-1]), indptr),
                      shape=(n, d))
    X.indices, X.indptr = X.indices.astype(index), X.indptr.astype(index)
    return X


def _kmeans_step(n: int, d: int, k: int, transposed: bool):
    """K-means' step as ``algorithms.kmeans`` writes it, the centroids (k, d) or held as (d, k)."""
    x, csq, group = la.value("X", (n, d)), la.value("csq", (k,)), la.value("ids", (k,))
    product = x @ la.value("C", (d, k)) if transposed else x @ la.value("C", (k, d)).T
    labels = (csq - 2.0 * product).argmin(axis=1, keepdims=True)
    onehot = (labels == group) * 1.0
    return labels, [onehot.T @ x, onehot.sum(axis=0)]


@pytest.mark.parametrize("ids", [[0.0, 1.0, 2.0, 3.0, 4.0], [3.0, 3.0, 9.0, 0.0, 1.0]])  # repeated, missing
@pytest.mark.parametrize("transposed", [True, False], ids=["C (d, k)", "C (k, d)"])
@pytest.mark.parametrize("index", ["int32", "int64"])
def test_the_kmeans_step_over_csr_is_one_loop_and_matches_scipy(index, transposed, ids, monkeypatch):
    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    n, d, k = 3001, 500, 5
    X = _integer_csr(n, d, index)
    C = np.random.default_rng(1).integers(-2, 3, (k, d)).astype(float)
    C[3] = C[1]  # equal centroids: every tie goes to the first
    _, outputs = _kmeans_step(n, d, k, transposed)
    values = {"X": X, "C": C.T.copy() if transposed else C, "csq": (C**2).sum(1), "ids": np.array(ids)}
    kernel, args = block_kernel(outputs, values)
    program = compiler.Program(kernel, args)
    assert len(program.packed) == 1 and program.csr == program.sparse
    readers = [op for op in program.ops if any(s in program.sparse for s in op.inputs)]
    assert len(readers) == 1  # one visit of the non-zeros: no SciPy product, no n × k scores
    got, want = program(args), kernels.interpret(kernel, *args)  # interpreted: SciPy's products
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("transposed", [True, False], ids=["C (d, k)", "C (k, d)"])
def test_the_nearest_centroid_of_csr_rows_matches_scipy(transposed, monkeypatch):
    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    n, d, k = 2000, 300, 6
    X = _integer_csr(n, d, "int32", seed=8)
    C = np.random.default_rng(2).integers(-2, 3, (k, d)).astype(float)
    labels, _ = _kmeans_step(n, d, k, transposed)
    values = {"X": X, "C": C.T.copy() if transposed else C, "csq": (C**2).sum(1)}
    kernel, args = block_kernel([labels], values)
    program = compiler.Program(kernel, args)
    assert [r.csr for r in program.rewrites.values()] == [tuple(program.sparse)]  # the one loop, X as CSR
    np.testing.assert_array_equal(program(args)[0], kernels.interpret(kernel, *args))


@pytest.mark.parametrize("index", ["int32", "int64"])
def test_the_kmeans_final_pass_over_csr_is_one_loop_and_matches_scipy(index, monkeypatch):
    """Labels and inertia (``algorithms.kmeans.kmeans_program(final=True)`` on a sparse X): the
    nearest centroid and each row's least score come from one loop, no n × k scores."""
    from arrayjob.algorithms.kmeans import centroid_values, kmeans_program

    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    n, d, k = 3001, 400, 5
    X = _integer_csr(n, d, index, seed=11)
    C = np.random.default_rng(6).integers(-2, 3, (k, d)).astype(float)
    C[4] = C[2]  # equal centroids: every tie goes to the first
    outputs = kmeans_program(la.value("X", (n, d)), k, final=True, sparse=True)
    values = {"X": X, **centroid_values(C, transposed=True), "cluster_ids": np.arange(k, dtype=float)}
    kernel, args = block_kernel(list(outputs.values()), values)
    program = compiler.Program(kernel, args)
    assert [len(p.parts) for p in program.packed] == [2]  # the labels and the least scores
    readers = [op for op in program.ops if any(s in program.sparse for s in op.inputs)]
    assert len(readers) == 2  # the loop and Σ x², no SciPy product
    assert not any(op.attrs == Einsum("ij,jk->ik") for op in program.ops)  # the scores are never made
    got, want = program(args), kernels.interpret(kernel, *args)  # interpreted: SciPy's products
    got, want = dict(zip(outputs, got, strict=True)), dict(zip(outputs, want, strict=True))
    inertia, labels = got["inertia"], got["labels"]
    np.testing.assert_array_equal(labels, want["labels"])
    assert labels.dtype == want["labels"].dtype
    assert float(inertia) == float(want["inertia"])  # integer data: exact in any order
    dense = X.toarray()
    assert float(inertia) == ((dense[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum()


@pytest.mark.parametrize("k", [7, 8, 16, 19, 24, 35, 40])  # below, in and past the vector registers' range
def test_every_k_gets_scipys_labels_sums_and_least_scores(k, monkeypatch):
    """The dot products of 8⌊k/8⌋ centroids run in vector registers (``kernels.lanes``) for
    8 ≤ k < 40, the rest one at a time: the step and the final pass equal SciPy's products on
    integer data, ties and all, whichever k."""
    from arrayjob.algorithms.kmeans import centroid_values, kmeans_program

    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    n, d = 1501, 300
    X = _integer_csr(n, d, "int32", seed=k)
    C = np.random.default_rng(k).integers(-2, 3, (k, d)).astype(float)
    C[k - 1] = C[k // 2]  # equal centroids: every tie goes to the first
    values = {"X": X, **centroid_values(C, transposed=True), "cluster_ids": np.arange(k, dtype=float)}
    for final in (False, True):
        outputs = kmeans_program(la.value("X", (n, d)), k, final=final, sparse=True)
        kernel, args = block_kernel(list(outputs.values()), values)
        program = compiler.Program(kernel, args)
        assert program.packed
        for g, w in zip(program(args), kernels.interpret(kernel, *args), strict=True):
            np.testing.assert_array_equal(g, w)


def test_the_csr_loops_read_a_block_that_starts_inside_its_arrays():
    """A row block cut from a chunk without copying: its row pointers start past 0 and index
    into the chunk's whole data and indices."""
    from arrayjob.kernels import loops
    from arrayjob.kernels.row_layouts import CSRRows

    n, d, k, lo, hi = 1000, 200, 4, 137, 801
    X = sp.csr_matrix(np.random.default_rng(3).standard_normal((n, d)) * (np.random.default_rng(4).random((n, d)) < 0.05))
    C = np.random.default_rng(5).standard_normal((k, d))
    a, ids = (C**2).sum(1), np.arange(k, dtype=float)
    Xd, Xi, Xp, _ = CSRRows().arguments(X)
    block = Xp[lo:hi + 1]  # indptr[0] = the block's first non-zero within the chunk
    assert block[0] > 0
    want_labels = (a - 2.0 * (X[lo:hi] @ C.T)).argmin(axis=1, keepdims=True)
    np.testing.assert_array_equal(loops.nearest_rows_csr(Xd, Xi, block, np.ascontiguousarray(C.T), a, 2.0), want_labels)
    packed = loops.nearest_group_sums_csr(Xd, Xi, block, d, np.ascontiguousarray(C.T), a, 2.0, ids)
    onehot = (want_labels == ids) * 1.0
    np.testing.assert_allclose(packed[:, :d], onehot.T @ X[lo:hi].toarray(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(packed[:, d], onehot.sum(axis=0))
    sums = loops.group_sum_csr(want_labels[:, 0], ids, Xd, Xi, block, d)
    np.testing.assert_allclose(sums, packed[:, :d], rtol=1e-12, atol=1e-12)


def test_a_csc_block_gets_no_csr_loop(monkeypatch):
    monkeypatch.setattr(compiler, "SPARSE_LOOP_MIN_BYTES", 0)
    n, d, k = 500, 100, 3
    X = _integer_csr(n, d, "int32").tocsc()
    C = np.random.default_rng(1).integers(-2, 3, (k, d)).astype(float)
    _, outputs = _kmeans_step(n, d, k, True)
    kernel, args = block_kernel(outputs, {"X": X, "C": C.T.copy(), "csq": (C**2).sum(1), "ids": np.arange(k, dtype=float)})
    program = compiler.Program(kernel, args)
    assert not program.csr and not program.packed
    for g, w in zip(program(args), kernels.interpret(kernel, *args), strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_map_of_a_sparse_block_is_of_its_elements_and_shares_a_canonical_structure():
    """X * X and |X| over the non-zeros: a block with repeated entries (summed, as SciPy reads
    them) is mapped after the sum; a canonical one keeps its index arrays, uncopied."""
    from arrayjob.kernels import sparse as block_steps

    repeated = sp.csr_matrix((np.array([-1.0, 2.0, 3.0]), np.array([1, 1, 0]), np.array([0, 2, 3])), shape=(2, 3))
    assert not repeated.has_canonical_format
    np.testing.assert_array_equal(block_steps._map("multiply", [repeated, repeated]).toarray(), repeated.toarray() ** 2)
    np.testing.assert_array_equal(block_steps._map("abs", [repeated]).toarray(), np.abs(repeated.toarray()))
    assert repeated.nnz == 3  # the block itself untouched
    canonical = _integer_csr(50, 20, "int32").tocsr()
    canonical.sum_duplicates()
    squared = block_steps._map("multiply", [canonical, canonical])
    np.testing.assert_array_equal(squared.toarray(), canonical.toarray() ** 2)
    assert np.shares_memory(squared.indices, canonical.indices) and np.shares_memory(squared.indptr, canonical.indptr)


def test_start_loops_starts_numba_once_in_a_thread_of_its_own():
    """What a worker reading a sparse block calls: numba starts in one thread, however often it
    is called, and the loops' machinery is loaded when that thread ends."""
    code = ("import threading\n"
            "from arrayjob import kernels\n"
            "kernels.start_loops(); kernels.start_loops()\n"
            "started = [t for t in threading.enumerate() if t.name == 'arrayjob-start-loops']\n"
            "assert len(started) == 1, started\n"
            "started[0].join(120)\n"
            "from arrayjob.kernels import loops\n"
            "assert loops.started.signatures, 'numba did not start'\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
