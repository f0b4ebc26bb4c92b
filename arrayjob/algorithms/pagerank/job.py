"""PageRank by power iteration, with the graph kept partitioned on the workers.

r ← d · Aᵀ D⁻¹ r + (d · Σ_dangling r + 1 − d) / n, from r = 1/n, until the L1 change is
at most ``tol`` (Page et al. 1999; networkx's conventions: duplicate edges count once,
self-loops are kept, dangling nodes spread their rank uniformly).

The transposed adjacency Aᵀ is built once on the workers (``algorithms.pagerank.graph``) and kept (``Session.persist``):
each edge chunk is renumbered (``degree_order``) and sorted by target block (32-bit ids when
they fit), every block's build task takes the sorted chunks and slices its edges out of each
(the only shuffle, plain integer arrays that Ray stores by a copy and hands over in place),
de-duplicates them and makes a CSR block of (targets in the block) × (all sources); once the
out-degrees are known (one more pass over the kept blocks) each block's columns are divided
by them and its dangling targets marked. An iteration is then one fused kernel per block
(KASEN's PageRank example): the SpMV, the update d·y + base, and the block's share of the
dangling mass and of the L1 change. Only vectors move: r goes to every block, each block
returns its slice of the new r and two partial sums.

Nodes are numbered anew before the build, by out-degree (``degree_order``): one pass over
the edges counts each node's out-edges, nodes are grouped by the power of two of that count
(degree-based grouping, Faldu et al. 2019), most edges first, and the groups are dealt
round-robin over the blocks. The SpMV gathers r[source] once per edge, so the ranks of the
sources with the most edges, now together at the start of every block's range, are mostly
read from the core's cache: on the 1M-node, 10M-edge R-MAT benchmark graph one block's SpMV
takes 10.3–17.4 ms (median 11.4) against 17.4–25.7 ms (median 19.7) under the Fibonacci
hash of the ids used before (``benchmarks/bench_micro.py pagerank-order``). Dealing also balances the blocks: power-law
graphs put most edges on a few low ids (R-MAT at 1M nodes: 58 % of the targets in the first
quarter of the ids), and dealt, each block gets every B-th node of every degree group (two
blocks: 4,865,410 and 4,845,602 nonzeros). The kept graph and the vectors of the iterations
are in the new numbering; the result is put back in id order at the end.

Blocks per worker: one, or two when each still holds ``EDGES_FOR_TWO_BLOCKS`` edges. On
small graphs an iteration's tasks are short (about 20 ms for 5M nonzeros) and Ray's cost
per task and per returned slice is not (on a local 2-CPU Ray, 2 tasks returning 4 MiB
each take 12.5–15.4 ms, 4 returning 2 MiB 14.5–16.5 ms, 4 returning nothing 7–10 ms:
``benchmarks/bench_micro.py ray-returns``): on 2 workers, two blocks made an iteration of
the 1M-node, 10M-edge benchmark graph 41–45 ms against 55–60 ms for four
(``benchmarks/bench_profile.py run pagerank``, three runs of each). On big graphs two
blocks per worker balance better: 4M nodes and 70M edges (estimate_accuracy's large
PageRank) took 0.28 s per iteration and a 14.7 s build with four blocks, 0.32–0.38 s and
16.4–18.3 s with two. The per-block sums of the L1 change and the dangling mass come back as a
(blocks, 2) array the driver adds up: summed as tasks they cost blocks + 1 more tasks and
two more round trips every iteration.

The edges are an (E, 2) array of (source, target), or the adjacency matrix A as a CSR group
(``io.sparse``), read as its pattern: PageRank is unweighted here, so the group's ``data``
(AnnData's always has some) is never read, and a group of only ``indptr``, ``indices`` and a
``shape`` attribute is read too. Its ``shape`` gives n (``params.n_nodes`` is not used), and
its ``indices`` are split in their stored chunks, not in the group's row blocks: the split
returns plain integer arrays of the rows its chunk holds, which the build takes as one
array, so the chunks must hold even numbers of edges, and row blocks do not (a power-law
graph puts most edges in a few of them). ``indptr``, read whole on a worker, gives every
chunk its edges' sources and, by its steps, the out-edge counts; a column index outside
[0, n) is refused naming its row, as ``io.sparse`` names one.

The rank vector (and the iteration's dangling mass) is checkpointed after an iteration
(``io.checkpoint``); a resumed run builds the graph again (the build is deterministic, so
the numbering is the same) and goes on from it.

Cost: build, two passes over the edges (16E bytes each; the count and the split) and one
shuffle of them; per iteration, 2E flops, 8n bytes to each of B blocks and 8n bytes back.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from arrayjob import api as la
from arrayjob.algorithms.pagerank.graph import (
    BuildBlock,
    CountOutEdges,
    GraphWork,
    SplitByTarget,
    SplitCSR,
    by_node_id,
    csr_out_edges,
    degree_order,
    id_dtype,
    id_range,
    out_degree,
    scale_block,
)
from arrayjob.api import (
    EACH_ITERATION,
    ArrayInfo,
    Job,
    JobContext,
    JobResult,
    Kernel,
    Pass,
    StagePlan,
    member_info,
    require,
)

# Two graph blocks per worker once each holds this many edges (about 30 ms of SpMV per
# iteration, several times Ray's cost per task); one below (see the module note).
EDGES_FOR_TWO_BLOCKS = 8_000_000
BUILT, SCALED = "pagerank-built", "pagerank-graph"  # handles the graph is kept under, built and scaled


@dataclass(frozen=True)
class PageRankStep:
    """One iteration on one block, fused: the SpMV, the update, and the block's share of
    the dangling mass and of the L1 change (KASEN's PageRank kernel)."""

    damping: float

    def __call__(self, blocks: np.ndarray, rank: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (g,) = blocks.ravel()
        new = self.damping * (g.matrix @ rank) + base
        old = rank[g.first: g.first + len(new)]
        stats = np.array([[np.abs(new - old).sum(), new[g.dangling].sum()]])
        return new, stats


@dataclass(frozen=True)
class PageRankParams:
    damping: float = field(default=0.85, metadata={"check": lambda v: 0 <= v < 1, "expect": "a number in [0, 1)"})
    tol: float = field(default=1e-6, metadata={"check": lambda v: v > 0 and np.isfinite(v), "expect": "a number > 0"})
    max_iter: int = field(default=100, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})
    n_nodes: int | None = field(default=None, metadata={"check": lambda v: v >= 1, "expect": "an integer >= 1"})


class PageRank(Job):
    name = "pagerank"
    title = "PageRank"
    inputs = ("edges",)
    # or the adjacency matrix as a CSR group, read as its pattern: PageRank here is unweighted,
    # so a group's data (AnnData's always has some) is not read, and a group may have none
    sparse_inputs = ("edges",)
    pattern_inputs = ("edges",)
    Params = PageRankParams
    params: PageRankParams

    @property
    def csr(self) -> bool:
        return self.arrays["edges"].sparse is not None

    def check_inputs(self) -> None:
        e = self.arrays["edges"]
        if e.sparse is not None:  # io.sparse checked the group; what is PageRank's own
            require(e.sparse.format == "csr", f"inputs.edges: {e.uri}: a {e.sparse.format}_matrix group; PageRank takes "
                                              f"the adjacency matrix as CSR (row i: the targets of node i's edges)")
            require(e.shape[0] == e.shape[1],
                    f"inputs.edges: {e.uri}: expected an adjacency matrix, shape = [n, n], got {list(e.shape)}")
            return
        require(e.ndim == 2 and e.shape[1] == 2, f"inputs.edges: expected an (E, 2) array of (source, target), got shape {e.shape}")
        require(np.dtype(e.dtype).kind in "iu", f"inputs.edges: expected integer node ids, got dtype {e.dtype}")

    def describe(self) -> str:
        return f"{self.title} on {self._edge_array.shape[0]:,} edges"

    @property
    def _edge_array(self) -> ArrayInfo:
        """The array the edges are split from: the (E, 2) edge list, or a CSR group's ``indices``
        (its targets; sources from its ``indptr``), read as a dense array in even chunks (see
        ``_build``)."""
        return self._member("indices") if self.csr else self.arrays["edges"]

    def _member(self, member: str) -> ArrayInfo:
        """A member array of the CSR group, named ``edges.<member>``: a program's sources need
        names of their own (and a failed read names it so)."""
        return dataclasses.replace(member_info(self.arrays["edges"], member), name=f"edges.{member}")

    def _edges(self) -> la.BlockArray:
        return la.from_input(self._edge_array)

    def _indptr(self) -> la.BlockArray:
        """A CSR group's ``indptr``, read whole on a worker (the sources of every edge chunk)."""
        return la.from_input(self._member("indptr"))

    def _block_rows(self, n: int, workers: int) -> int:
        """Rows (target nodes) per block of Aᵀ."""
        per_worker = 2 if self._edge_array.shape[0] >= 2 * workers * EDGES_FOR_TWO_BLOCKS else 1  # see the module note
        return math.ceil(n / max(1, min(n, per_worker * workers)))

    def _build(self, n: int, workers: int) -> tuple[dict[str, la.BlockArray], int]:
        e = self._edge_array
        chunk = e.chunks[0]
        chunks = math.ceil(e.shape[0] / chunk)
        block = self._block_rows(n, workers)
        blocks = math.ceil(n / block)
        sorted_edges = [((e.shape[0], 2), id_dtype(n), chunk), ((chunks, blocks + 1), "int64", 1)]
        labels = la.value("labels", (n,), id_dtype(n))
        if self.csr:  # chunks of indices, not the group's row blocks: the shuffle's chunks are even
            starts = la.value("chunk_starts", (chunks,), "int64")
            split = SplitCSR(n, block, self.arrays["edges"])
            edges, offsets = la.map_blocks(Kernel("split_csr_by_target", split),
                                           self._edges(), starts, self._indptr(), labels, outputs=sorted_edges,
                                           block_rows=[chunk, 1, None, None], cost=GraphWork("split_csr"))
        else:
            edges, offsets = la.map_blocks(Kernel("split_by_target", SplitByTarget(n, block)),
                                           self._edges(), labels, outputs=sorted_edges, block_rows=[chunk, None],
                                           cost=GraphWork("split"))
        (graph,) = la.map_blocks(Kernel("build_csr_block", BuildBlock(n, block, chunk)),
                                 la.value("block_ids", (blocks,), "int64"), edges, offsets,
                                 outputs=[((blocks, 1), "object", 1, self._graph_block_bytes(n, blocks))],
                                 block_rows=[1, None, None],
                                 cost=GraphWork("build", self._edges_per_block(blocks)))
        return {"graph": graph}, block

    def stages(self, workers: int, n_nodes: int | None = None) -> StagePlan:
        """In "load": node-id range (none for a CSR group: its shape has n, and its indices are
        checked where they are split), out-edge counts (of a CSR group, from its indptr), the
        build (kept as ``BUILT``), out-degrees, scaling (kept as ``SCALED``); then one
        iteration per iteration. For ``n_nodes`` nodes: a run learns the count from the id
        range; without ``params.n_nodes`` a plan assumes as many nodes as edges."""
        n = self._nodes_for_planning() if n_nodes is None else n_nodes
        build, block = self._build(n, workers)
        blocks = build["graph"].shape[0]
        built = self._kept(BUILT, build["graph"], self._graph_block_bytes(n, blocks))
        scaled = self._kept(SCALED, build["graph"], self._graph_block_bytes(n, blocks, scaled=True))
        if self.csr:
            (out_edges,) = la.map_blocks(Kernel("csr_out_edges", csr_out_edges), self._indptr(),
                                         outputs=[((n,), "int64", None)])
            counts: tuple[Pass, ...] = (Pass("count", "load", {"out_edges": out_edges}),)
        else:
            counts = (Pass("id_range", "load", self._id_range_program()),
                      Pass("count", "load", self._count_program(n)))
        return StagePlan((
            *counts,
            Pass("build", "load", build, keeps=BUILT),
            Pass("degree", "load", self._degree_program(built, n)),
            Pass("scale", "load", self._scale_program(built, n), keeps=SCALED, releases=(BUILT,)),
            Pass("iterate", "fit", self._iteration(scaled, n, block), EACH_ITERATION),
        ))

    @staticmethod
    def _kept(handle: str, graph: la.BlockArray, block_bytes: int) -> la.BlockArray:
        """The graph as ``Session.persist(..., handle=handle)`` keeps it: one block per row."""
        return la.cached(f"{handle}:graph", graph.shape, "object", (1, 1), block_bytes)

    def _graph_block_bytes(self, n: int, blocks: int, scaled: bool = False) -> int:
        """The bytes of one block of Aᵀ, for the cost model and the memory budget (an object
        block's dtype cannot say): a CSR matrix of the block's edges (every edge counted, so
        an upper bound where edges repeat), float64 values and SciPy's index type (32 bits
        while the ids and the nonzeros fit), its row pointers, and once scaled the block's
        dangling-target mask."""
        rows = math.ceil(n / max(1, blocks))
        edges = math.ceil(self._edge_array.shape[0] / max(1, blocks))
        index = 4 if max(n, edges) <= np.iinfo(np.int32).max else 8
        return edges * (8 + index) + (rows + 1) * index + (rows if scaled else 0)

    def _count_program(self, n: int) -> dict[str, la.BlockArray]:
        e = self._edge_array
        chunk = e.chunks[0]
        chunks = math.ceil(e.shape[0] / chunk) if e.shape[0] else 1
        (parts,) = la.map_blocks(Kernel("count_out_edges", CountOutEdges(n)), self._edges(),
                                 outputs=[((chunks, n), "int64", 1)], block_rows=[chunk],
                                 cost=GraphWork("count", vector=n))
        return {"out_edges": parts.sum(axis=0)}

    def _edges_per_block(self, blocks: int) -> float:
        """Edges in one block of Aᵀ, for the cost model: spread evenly over the blocks."""
        return self._edge_array.shape[0] / max(1, blocks)

    def _degree_program(self, graph: la.BlockArray, n: int) -> dict[str, la.BlockArray]:
        (degree_parts,) = la.map_blocks(Kernel("out_degree", out_degree), graph,
                                        outputs=[((graph.shape[0], n), "float64", 1)], block_rows=[1],
                                        cost=GraphWork("product", self._edges_per_block(graph.shape[0]), vector=n))
        return {"d": degree_parts.sum(axis=0)}

    def _scale_program(self, graph: la.BlockArray, n: int) -> dict[str, la.BlockArray]:
        (scaled,) = la.map_blocks(Kernel("scale_by_out_degree", scale_block), graph,
                                  la.value("inverse_degree", (n,)), la.value("dangling", (n,), "bool"),
                                  outputs=[(graph.shape, "object", 1,
                                            self._graph_block_bytes(n, graph.shape[0], scaled=True))],
                                  block_rows=[1, None, None],
                                  cost=GraphWork("scale", self._edges_per_block(graph.shape[0])))
        return {"graph": scaled}

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        return [((self._nodes_for_planning(),), "float64", None)]

    def _nodes_for_planning(self) -> int:
        if self.csr:
            return self.arrays["edges"].shape[0]
        return self.params.n_nodes or max(1, self._edge_array.shape[0])

    def _iteration(self, graph: la.BlockArray, n: int, block: int) -> dict[str, la.BlockArray]:
        blocks = graph.shape[0]
        rank, stats = la.map_blocks(Kernel("pagerank_step", PageRankStep(self.params.damping)), graph,
                                    la.value("rank", (n,)), la.value("base", ()),
                                    outputs=[((n,), "float64", block), ((blocks, 2), "float64", 1)],
                                    block_rows=[1, None, None],
                                    cost=GraphWork("product", self._edges_per_block(blocks), block, vector=n))
        # per block [L1 change, dangling mass]: the driver adds the B rows (a sum as tasks
        # would be B + 1 more tasks and two more round trips every iteration)
        return {"rank": rank, "stats": stats}

    def run(self, ctx: JobContext) -> JobResult:
        p = self.params
        E = self._edge_array.shape[0]
        workers = ctx.workers
        with ctx.stage("load"):
            if self.csr:
                n = self._nodes_for_planning()
            else:
                r = ctx.compute(self.stages(workers)["id_range"])  # the programs after it need n
                ids = np.array([r["lo"][0], r["hi"][1]])
                n = p.n_nodes or int(ids[1]) + 1
                require(E == 0 or ids[0] >= 0, f"inputs.edges: node ids must be >= 0, found {int(ids[0])}")
                require(E == 0 or ids[1] < n,
                        f"inputs.edges: node id {int(ids[1])} is out of range for params.n_nodes = {n}")
            plan = self.stages(workers, n_nodes=n)
            block = self._block_rows(n, workers)
            values = {"block_ids": np.arange(-(-n // block), dtype=np.int64)}
            if self.csr:
                values["chunk_starts"] = np.arange(0, max(E, 1), self._edge_array.chunks[0], dtype=np.int64)
            out_edges = ctx.compute(plan["count"])["out_edges"]
            labels = degree_order(out_edges, block)
            kept = ctx.persist(plan["build"], values | {"labels": labels}, handle=BUILT)
            outdeg = ctx.compute(plan["degree"])["d"]
            dangling = outdeg == 0
            inverse = np.where(dangling, 0.0, 1.0 / np.where(dangling, 1.0, outdeg))
            graph = ctx.persist(plan["scale"], {"inverse_degree": inverse, "dangling": dangling},
                                handle=SCALED)
            blocks = kept["graph"].shape[0]
            for handle, arrays, nbytes in ((BUILT, kept, self._graph_block_bytes(n, blocks)),
                                           (SCALED, graph, self._graph_block_bytes(n, blocks, scaled=True))):
                declared = self._kept(handle, arrays["graph"], nbytes)  # as the declared programs read them
                assert arrays["graph"].attrs == declared.attrs, (arrays["graph"].attrs, declared.attrs)
            ctx.release(kept)
            saved = ctx.restore()  # the rank vector after an iteration (in the new numbering)
        step = plan["iterate"]
        if saved is None:
            rank = np.full(n, 1.0 / n)
            dangling_mass = float(rank[dangling].sum())
            converged, iterations, delta = False, 0, np.inf
        else:
            st = saved.state
            rank, dangling_mass, delta = st["rank"], float(st["dangling_mass"]), float(st["l1_change"])
            converged, iterations = bool(st["converged"]), int(st["iteration"])
        with ctx.stage(plan.stage_of("iterate")):
            while not converged and iterations < p.max_iter:
                base = (p.damping * dangling_mass + 1.0 - p.damping) / n
                r = ctx.compute(step, {"rank": rank, "base": base})
                rank, (delta, dangling_mass) = r["rank"], (float(v) for v in r["stats"].sum(axis=0))
                iterations, converged = iterations + 1, delta <= p.tol
                ctx.iteration(iterations, p.max_iter, l1_change=delta, tol=p.tol)
                ctx.checkpoint(iterations, {"rank": rank, "dangling_mass": dangling_mass, "l1_change": delta,
                                            "iteration": iterations, "converged": converged})
        ctx.release(graph)
        rank = by_node_id(rank, labels)
        rank /= rank.sum()
        attrs = {"iterations": iterations, "converged": converged, "l1_change": delta, "n_nodes": n,
                 "damping": p.damping}
        return JobResult({"rank": rank}, attrs,
                         [f"{'converged' if converged else 'did NOT converge'} in {iterations} iterations "
                          f"(L1 change {delta:.2e}, tol {p.tol:g}); {n:,} nodes, {E:,} edges"])

    def _id_range_program(self) -> dict[str, la.BlockArray]:
        e = self._edge_array
        chunk = e.chunks[0]
        chunks = math.ceil(e.shape[0] / chunk) if e.shape[0] else 1
        (parts,) = la.map_blocks(Kernel("id_range", id_range), self._edges(), outputs=[((chunks, 2), "int64", 1)],
                                 block_rows=[chunk])
        return {"lo": parts.min(axis=0), "hi": parts.max(axis=0)}
