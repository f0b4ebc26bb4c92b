"""Random array programs give NumPy's results under every tiling strategy and placement.

``random_program`` builds a seeded program of 2-15 operators over small stored arrays —
elementwise ops with broadcasting, where/maximum/exp/log1p/sigmoid, reductions along axes,
matmul/tensordot/einsum, transposes — together with its NumPy reference. ``test_tiling``
uses the same programs to compare the tiling searches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit

import arrayjob.lazy as la
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import ArrayInfo, Location, StorageOptions, parse_uri
from arrayjob.planner.ir import Graph
from arrayjob.planner.lower import assemble_outputs
from arrayjob.planner.pipeline import fuse, place
from arrayjob.planner.plan import ClusterShape, Plan, PlanOptions, Tiling
from arrayjob.planner.tiling import with_tilings
from arrayjob.planner.tiling_model import candidates
from arrayjob.runtime.executor import LocalExecutor
from arrayjob.runtime.session import Session
from tests.harness.helpers import write_array

# a stored array: (name, data, chunks) -> the lazy array reading it
SourceMaker = Callable[[str, np.ndarray, tuple[int, ...]], la.BlockArray]


@dataclass
class Program:
    """A lazy program, the NumPy values it must give, and what it was built from."""

    seed: int
    outputs: dict[str, la.BlockArray]
    expected: dict[str, np.ndarray]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)  # a readable trace, for failure messages

    def __str__(self) -> str:
        return f"program seed={self.seed}:\n  " + "\n  ".join(self.steps)


def fake_source(name: str, data: np.ndarray, chunks: tuple[int, ...]) -> la.BlockArray:
    """A stored array known by its metadata only: enough to plan, not to run."""
    return la.from_zarr(ArrayInfo(name, Location("file", f"/nowhere/{name}.zarr"), data.shape,
                                  str(data.dtype), chunks, 3))


def zarr_source(root: Path) -> SourceMaker:
    def make(name: str, data: np.ndarray, chunks: tuple[int, ...]) -> la.BlockArray:
        uri = str(root / f"{name}.zarr")
        write_array(uri, data, chunks)
        return la.from_zarr(open_array_info(name, parse_uri(uri), StorageOptions()))

    return make


def _chunks(rng: np.random.Generator, shape: tuple[int, ...], by_dim: dict[int, int]) -> tuple[int, ...]:
    """Storage chunks: often shared per dimension (co-partitioned arrays), sometimes not."""
    out = []
    for s in shape:
        r = rng.random()
        if r < 0.25:
            out.append(s)
        elif r < 0.75:
            out.append(by_dim.setdefault(s, int(rng.integers(1, s + 1))))
        else:
            out.append(int(rng.integers(1, s + 1)))
    return tuple(out)


Arr = tuple[la.BlockArray, np.ndarray]  # a lazy array and the NumPy value it must have


class _ProgramBuilder:
    """Grows a random program one operator at a time, with NumPy alongside."""

    def __init__(self, seed: int, make_source: SourceMaker) -> None:
        self.rng = rng = np.random.default_rng(seed)
        n, d, k = int(rng.integers(6, 41)), int(rng.integers(2, 7)), int(rng.integers(2, 6))
        if k == d:
            k += 1  # distinct sizes keep the random shape matching honest
        menu = {"X": (n, d), "Y": (n, k), "u": (n,), "v": (d,), "M": (d, k), "T": (n, d, k)}
        names = list(rng.choice(list(menu), size=int(rng.integers(1, 4)), replace=False,
                                p=[0.3, 0.15, 0.2, 0.1, 0.15, 0.1]))
        if "X" not in names and rng.random() < 0.7:
            names[0] = "X"
        self.prog = Program(seed, {}, {})
        self.pool: list[Arr] = []  # the float arrays later ops may use
        self.results: list[tuple[str, la.BlockArray, np.ndarray]] = []
        self.ops = 0
        by_dim: dict[int, int] = {}
        for name in names:
            data = rng.standard_normal(menu[name])
            chunks = _chunks(rng, data.shape, by_dim)
            self.pool.append((make_source(name, data, chunks), data))
            self.prog.steps.append(f"{name} = source{data.shape} chunks={chunks}")
        if rng.random() < 0.4:  # a driver value, like the weights of an iterative job
            shape = menu[str(rng.choice(["v", "u"]))]
            data = rng.standard_normal(shape)
            self.prog.values["w"] = data
            self.pool.append((la.value("w", shape), data))
            self.prog.steps.append(f"w = value{shape}")

    def add(self, label: str, lazy: la.BlockArray, ref: Any, ops: int, usable: bool = True) -> None:
        ref = np.asarray(ref)
        assert lazy.shape == ref.shape, (label, lazy.shape, ref.shape)
        self.ops += ops
        name = f"t{len(self.results)}"
        self.prog.steps.append(f"{name} = {label}  -> {ref.shape}")
        self.results.append((name, lazy, ref))
        if usable:
            self.pool.append((lazy, ref))

    def pick(self, fits: Callable[[tuple[int, ...]], bool] = lambda s: True) -> Arr | None:
        arrays = [a for a in self.pool if fits(a[1].shape)]
        if not arrays:
            return None
        # recent results more often, so programs are chains and trees, not just fans;
        # scalars seldom, since little can follow them
        weights = np.arange(1, len(arrays) + 1, dtype=float) ** 1.5
        weights *= [1.0 if v.ndim else 0.2 for _, v in arrays]
        return arrays[int(self.rng.choice(len(arrays), p=weights / weights.sum()))]

    def partner(self, shape: tuple[int, ...]) -> Arr | None:
        """An array that broadcasts against ``shape`` without growing it."""
        def fits(s: tuple[int, ...]) -> bool:
            try:
                return np.broadcast_shapes(s, shape) == shape
            except ValueError:
                return False
        return self.pick(fits)

    # -- operators ----------------------------------------------------------------------------
    def unary(self, a: Arr) -> None:
        x, xv = a
        f = str(self.rng.choice(["sigmoid", "tanh", "negative", "exp", "log1p", "abs"]))
        if f == "exp":  # squashed first: exp of a large contraction would overflow
            self.add("exp(tanh(.))", la.exp(la.tanh(x)), np.exp(np.tanh(xv)), 2)
        elif f == "log1p":
            self.add("log1p(square(.))", la.log1p(la.square(x)), np.log1p(np.square(xv)), 2)
        elif f == "sigmoid":
            self.add("sigmoid", la.sigmoid(x), expit(xv), 1)
        elif f == "tanh":
            self.add("tanh", la.tanh(x), np.tanh(xv), 1)
        elif f == "abs":
            self.add("abs", la.absolute(x), np.abs(xv), 1)
        else:
            self.add("negative", -x, -xv, 1)

    def binary(self, a: Arr) -> None:
        f = str(self.rng.choice(["add", "subtract", "multiply", "maximum", "minimum", "scalar"]))
        x, xv = a
        if f == "scalar":
            c = float(np.round(self.rng.uniform(-2, 2), 2))
            self.add(f"{c} * .", c * x, c * xv, 1)
            return
        b = self.partner(xv.shape)
        if b is None:
            return
        if self.rng.random() < 0.5:  # the broadcast operand first, sometimes
            a, b = b, a
        (x, xv), (y, yv) = a, b
        lazy = {"add": la.BlockArray.__add__, "subtract": la.BlockArray.__sub__,
                "multiply": la.BlockArray.__mul__, "maximum": la.maximum, "minimum": la.minimum}[f](x, y)
        ref = getattr(np, f)(xv, yv)
        self.add(f"{f}{xv.shape}{yv.shape}", lazy, ref, 1)

    def where(self, a: Arr) -> None:
        x, xv = a
        b = self.partner(xv.shape)
        if b is not None:
            y, yv = b
            self.add(f"where(. > 0, ., {yv.shape})", la.where(x > 0, x, y), np.where(xv > 0, xv, yv), 2)

    def reduce(self, a: Arr) -> None:
        x, xv = a
        if xv.ndim == 0:
            return
        f = str(self.rng.choice(["sum", "mean", "max", "min"]))
        axis = None if self.rng.random() < 0.15 else int(self.rng.integers(0, xv.ndim))
        keep = bool(self.rng.random() < 0.25)
        self.add(f"{f}(axis={axis}, keepdims={keep})", getattr(x, f)(axis=axis, keepdims=keep),
                 getattr(np, f)(xv, axis=axis, keepdims=keep), 2 if f == "mean" else 1)

    def arg(self, a: Arr) -> None:
        x, xv = a
        if xv.ndim == 0:
            return
        f = str(self.rng.choice(["argmax", "argmin"]))
        axis = int(self.rng.integers(0, xv.ndim))
        # integer results end a path: they are outputs, not inputs of later float ops
        self.add(f"{f}(axis={axis})", getattr(x, f)(axis), getattr(np, f)(xv, axis=axis), 1, usable=False)

    def contract(self, a: Arr) -> None:
        x, xv = a
        form = str(self.rng.choice(["matmul", "tensordot", "rowdot", "outer", "einsum3"]))
        if form == "matmul" and xv.ndim in (1, 2):
            b = self.pick(lambda s: len(s) in (1, 2) and s[0] == xv.shape[-1] and len(s) + xv.ndim > 2)
            if b is not None:
                self.add(f"matmul{xv.shape}{b[1].shape}", x @ b[0], xv @ b[1], 1)
        elif form == "tensordot" and xv.ndim >= 1:
            b = self.pick(lambda s: len(s) >= 1 and s[0] == xv.shape[0] and len(s) + xv.ndim <= 4)
            if b is not None:  # X.T @ Y-like; a Gram matrix when b is a
                self.add(f"tensordot{xv.shape}{b[1].shape} axes=0,0", la.tensordot(x, b[0], ([0], [0])),
                         np.tensordot(xv, b[1], ([0], [0])), 1)
        elif form == "rowdot" and xv.ndim == 2:
            b = self.pick(lambda s: s == xv.shape)
            if b is not None:
                self.add("einsum(ij,ij->i)", la.einsum("ij,ij->i", x, b[0]), np.einsum("ij,ij->i", xv, b[1]), 1)
        elif form == "outer" and xv.ndim == 1 and xv.shape[0] <= 12:
            b = self.pick(lambda s: len(s) == 1)
            if b is not None:
                self.add("einsum(i,j->ij)", la.einsum("i,j->ij", x, b[0]), np.einsum("i,j->ij", xv, b[1]), 1)
        elif form == "einsum3" and xv.ndim == 3:
            _, dd, kk = xv.shape
            b = self.pick(lambda s: s == (dd, kk))
            if b is not None:
                self.add("einsum(ijk,jk->i)", la.einsum("ijk,jk->i", x, b[0]), np.einsum("ijk,jk->i", xv, b[1]), 1)
                return
            # MTTKRP-like: T x_2 B x_3 C
            bb = self.pick(lambda s: len(s) == 2 and s[0] == dd)
            cc = self.pick(lambda s: len(s) == 2 and s[0] == kk)
            if bb is not None and cc is not None and bb[1].shape[1] == cc[1].shape[1]:
                self.add("einsum(ijk,jf,kf->if)", la.einsum("ijk,jf,kf->if", x, bb[0], cc[0]),
                         np.einsum("ijk,jf,kf->if", xv, bb[1], cc[1]), 1)

    def transpose(self, a: Arr) -> None:
        x, xv = a
        perm = tuple(int(p) for p in self.rng.permutation(xv.ndim))
        if xv.ndim >= 2 and perm != tuple(range(xv.ndim)):
            self.add(f"transpose{perm}", la.transpose(x, perm), np.transpose(xv, perm), 1)

    def build(self, max_ops: int) -> Program:
        kinds = {self.unary: 0.2, self.binary: 0.22, self.where: 0.08, self.reduce: 0.18, self.arg: 0.05,
                 self.contract: 0.2, self.transpose: 0.07}
        target = int(self.rng.integers(2, max_ops + 1))
        for _ in range(200):
            if self.ops >= target:
                break
            op = list(kinds)[int(self.rng.choice(len(kinds), p=list(kinds.values())))]
            a = self.pick()
            assert a is not None
            op(a)
        if not self.results:  # nothing fitted: at least a reduction of the first array
            x, xv = self.pool[0]
            self.add("sum", x.sum(), xv.sum(), 1)
        last = len(self.results) - 1
        others = self.rng.choice(len(self.results), size=min(2, len(self.results)), replace=False)
        for i in sorted({last, *(int(i) for i in others)}):
            name, lazy, ref = self.results[i]
            self.prog.outputs[name] = lazy
            self.prog.expected[name] = ref
        return self.prog


def random_program(seed: int, make_source: SourceMaker = fake_source, max_ops: int = 15) -> Program:
    """A seeded program of 2..``max_ops`` operators (each lazy call counts one), with its NumPy values."""
    return _ProgramBuilder(seed, make_source).build(max_ops)


# -- correctness ----------------------------------------------------------------------------

SEEDS = range(60)
STRATEGIES = [(tiling, placement) for tiling in ("naive", "greedy", "exact") for placement in ("ray", "roundrobin")]


def check_results(prog: Program, out: dict[str, np.ndarray], where: str) -> None:
    for name, ref in prog.expected.items():
        got = out[name]
        assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape} ({where})\n{prog}"
        if ref.dtype.kind in "biu":
            assert np.array_equal(got, ref), f"{name} differs ({where})\n{prog}"
        else:
            np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-9, err_msg=f"{name} ({where})\n{prog}")


@pytest.mark.parametrize("seed", SEEDS)
def test_random_program_matches_numpy(seed: int, tmp_path: Path) -> None:
    prog = random_program(seed, zarr_source(tmp_path))
    executor = LocalExecutor(StorageOptions())  # shared: each source block is read once
    cluster = ClusterShape(nodes=1 + seed % 3, workers_per_node=2)
    for tiling, placement in STRATEGIES:
        options = PlanOptions(tiling=tiling, fusion="none", placement=placement, cluster=cluster,
                              target_block_bytes=2048)
        out = Session(executor, options).compute(prog.outputs, prog.values)
        check_results(prog, out, f"tiling={tiling}, placement={placement}")


def run_with_tilings(prog: Program, options: PlanOptions, choose: Callable[[Graph, int], Tiling],
                     executor: LocalExecutor) -> dict[str, np.ndarray]:
    """Plan ``prog`` with the tiling ``choose(graph, node)`` gives each node, run it, assemble."""
    graph = la.capture(list(prog.outputs.values()))
    plan = with_tilings(Plan(graph, options), tuple(choose(graph, i) for i in range(len(graph))))
    plan = place(fuse(plan))
    assert plan.physical is not None
    values = {name: np.asarray(v, dtype=np.float64) for name, v in prog.values.items()}
    return dict(zip(prog.outputs, assemble_outputs(plan, executor.run(plan.physical, values)), strict=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_any_candidate_tiling_matches_numpy(seed: int, tmp_path: Path) -> None:
    """Lowering runs every tiling ``candidates`` offers, however the neighbours are cut."""
    prog = random_program(seed, zarr_source(tmp_path))
    rng = np.random.default_rng(seed)
    options = PlanOptions(fusion="none", placement="roundrobin", cluster=ClusterShape(nodes=1 + seed % 3),
                          target_block_bytes=1024)

    def choose(graph: Graph, node: int) -> Tiling:
        cands = candidates(graph, node, options)
        return cands[int(rng.integers(len(cands)))]

    out = run_with_tilings(prog, options, choose, LocalExecutor(StorageOptions()))
    check_results(prog, out, "random candidate tilings")
