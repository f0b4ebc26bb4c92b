"""The tiling graph and its cost model (Spartan, Huang et al., ATC'15): what every choice of
tilings costs, from shapes alone; ``planner.tiling``'s strategies search it.

*Block lengths*, one per axis class (axes that must line up for an op to move no data):
chunk-aligned for stored arrays, sized so each class has about two blocks per worker
without a block exceeding the byte budget (``block_lengths``). Given those, every operator
has a known communication cost for the tilings of its inputs and its output
(``TilingModel``), and the nodes with their data dependencies form a *tiling graph*.
``communication_cost`` prices any full assignment.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from arrayjob.io.locations import ArrayInfo
from arrayjob.planner.fixed import fixed_blocking
from arrayjob.planner.ir import Graph, blockwise_call
from arrayjob.planner.ops import REDUCTIONS, Blockwise, Op, Reduce, Source, Store, Transpose
from arrayjob.planner.plan import Plan, PlanOptions, Tiling


def block_lengths(graph: Graph, options: PlanOptions) -> dict[int, int]:
    """One block length per axis class.

    A class that holds an axis of a stored array is cut on that array's chunk boundaries
    (the largest such array decides); other classes get about two blocks per worker.
    """
    classes = graph.axis_classes
    workers = options.workers_for_tiling
    anchor: dict[int, tuple[int, int, int]] = {}  # class -> (array bytes, chunk, other-axes bytes)
    for i, node in enumerate(graph.nodes):
        if not isinstance(node.attrs, Source):
            continue
        info: ArrayInfo = node.attrs.array
        for a, chunk in enumerate(info.chunks):
            c = classes.of_axis(i, a)
            other = node.nbytes // max(1, node.shape[a])  # bytes per unit of this axis (sparse: on average)
            if c not in anchor or node.nbytes > anchor[c][0]:
                anchor[c] = (node.nbytes, max(1, chunk), other)
    lengths: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for a, size in enumerate(node.shape):
            c = classes.of_axis(i, a)
            if c in lengths:
                continue
            wanted = max(1, math.ceil(size / (2 * workers)))
            if c in anchor:
                _, chunk, other = anchor[c]
                by_budget = max(1, options.target_block_bytes // max(1, chunk * other))
                chunks = math.ceil(size / chunk)
                by_parallelism = max(1, math.ceil(chunks / (2 * workers)))
                lengths[c] = chunk * min(by_budget, by_parallelism)
            else:
                lengths[c] = wanted
    return lengths


def plan_lengths(graph: Graph, options: PlanOptions) -> dict[int, int]:
    """``block_lengths``, overridden where the program fixes them (``map_blocks`` row blocks)."""
    return {**block_lengths(graph, options), **fixed_blocking(graph)[1]}


# -- the tiling graph and its cost model ------------------------------------------------------

Cut = frozenset[int]  # the axis classes a tiling really cuts (more than one block)


class TilingModel:
    """The tiling graph of one program: candidate tilings per node, communication cost per op.

    Costs are bytes moved between workers, priced as Spartan prices its operators. A set
    of cut classes ``C`` is spread over ``pieces(C) = min(P, blocks of C)`` workers, with
    ``P = options.cluster.workers``. For an op, its *iteration space* ``S`` is what
    lowering iterates over: the classes cut in its output plus those cut in an input and
    summed away. Then

    - an input whose cut classes are not ``S ∩ its classes`` is re-tiled:
      ``bytes × (m-1)/m``, ``m = pieces(old ∪ new)`` (a gather, scatter or shuffle);
    - an input is replicated along the classes of ``S`` it lacks (the broadcast of a whole
      weight vector to the row blocks of ``X @ w``): ``bytes × (pieces(S - its classes) - 1)``;
    - a contraction or reduction over cut classes ``R`` yields partial outputs, combined
      across workers: ``output bytes × (pieces(R) - 1)``.

    So elementwise ops on co-partitioned inputs cost 0, and a transpose tiled as its input
    (permuted) costs 0. A stored array starts tiled as the workers read it in parallel,
    its *natural* tiling (the classes where it has several chunks): any other tiling is a
    re-tiling of that, and cutting an axis whose chunks do not line up with the class's
    block length reads the whole array again.

    Lowering imposes hard rules, kept by the candidates: driver values and constants are
    whole; a class that appears twice in one node (the ``d`` of a Gram matrix ``X.T @ X``)
    is never cut; an argmax/argmin input is not cut along the reduced axis; an array
    ``store``d is cut only on whole chunks of its target. What the program fixes itself
    (``map_blocks`` row blocks, see ``planner/fixed.py``) is the only candidate, and a
    block function's inputs are priced as re-tiled to its row blocks or sent whole to
    each of its tasks.
    """

    def __init__(self, graph: Graph, options: PlanOptions) -> None:
        self.graph, self.options = graph, options
        self.workers = options.workers_for_tiling
        self.lengths = plan_lengths(graph, options)
        self.fixed = fixed_blocking(graph)[0]
        ac = graph.axis_classes
        self.classes = [ac.of_node(i, n.ndim) for i, n in enumerate(graph.nodes)]
        self.blocks = {c: math.ceil(ac.length(c) / max(1, n)) for c, n in self.lengths.items()}
        self.forbidden = self._forbidden_axes()
        # what op_cost reads, computed once: it runs for every entry of every cost table
        self.nbytes = [n.nbytes for n in graph.nodes]
        self.class_set = [frozenset(cls) for cls in self.classes]
        self.operands = [[u for u in dict.fromkeys(n.inputs) if graph.nodes[u].op is not Op.CONST]  # constants are inlined
                         for n in graph.nodes]
        self._pieces: dict[frozenset[int], int] = {}
        self._group_nodes()

    # -- rules --------------------------------------------------------------------------------
    def _forbidden_axes(self) -> list[set[int]]:
        """Per node, the axes lowering cannot cut (see the class docstring)."""
        twice = {c for cls in self.classes for c in cls if cls.count(c) > 1}
        forbidden = [{a for a, c in enumerate(cls) if c in twice} for cls in self.classes]
        for i, node in enumerate(self.graph.nodes):
            attrs = node.attrs
            if node.sparse is not None:  # a sparse matrix is cut into rows only (CSR blocks)
                forbidden[i].update(a for a in range(node.ndim) if a != node.sparse.rows)
            if isinstance(attrs, Reduce) and REDUCTIONS[attrs.fn].is_arg:
                forbidden[node.inputs[0]].update(attrs.axes)  # no combine for arg-reductions
            elif isinstance(attrs, Store):  # each block written must cover whole chunks of the target
                u, target = node.inputs[0], attrs.target
                forbidden[u].update(a for a, c in enumerate(self.classes[u])
                                    if self.lengths.get(c, 1) % max(1, target.chunks[a]))
        return forbidden

    def cuttable(self, node: int) -> list[int]:
        """Axes of ``node`` that may be cut into more than one block."""
        n = self.graph.nodes[node]
        if n.op.from_driver:
            return []
        return [a for a, c in enumerate(self.classes[node])
                if n.shape[a] > 1 and self.blocks.get(c, 1) > 1 and a not in self.forbidden[node]]

    def cut(self, node: int, tiling: Tiling) -> Cut:
        return frozenset(self.classes[node][a] for a in tiling.axes if self.blocks.get(self.classes[node][a], 1) > 1)

    def pieces(self, classes: frozenset[int]) -> int:
        if classes not in self._pieces:
            self._pieces[classes] = min(self.workers, math.prod(self.blocks.get(c, 1) for c in classes))
        return self._pieces[classes]

    def check(self, tilings: tuple[Tiling, ...]) -> None:
        """Raise ValueError if lowering could not run ``tilings``; names the node."""
        if len(tilings) != len(self.graph):
            raise ValueError(f"{len(tilings)} tilings for a graph of {len(self.graph)} nodes")
        for i, (n, t) in enumerate(zip(self.graph.nodes, tilings, strict=True)):
            if i in self.fixed:
                continue
            bad = [a for a in t.axes if not 0 <= a < n.ndim or (n.shape[a] > 1 and (
                n.op.from_driver or a in self.forbidden[i]))]
            if bad:
                raise ValueError(f"node {i} ({n.label()}): axis {bad[0]} cannot be cut")

    # -- costs ----------------------------------------------------------------------------------
    def op_cost(self, v: int, cut: Callable[[int], Cut]) -> int:
        """Bytes op ``v`` moves, given the cut classes of every node (``cut(node)``)."""
        op = self.graph.nodes[v].op
        if op is Op.SOURCE:
            return self.source_cost(v, cut(v))
        if op.from_driver:
            return 0
        if op is Op.BLOCKWISE:
            return self.blockwise_cost(v, cut)
        own = self.class_set[v]
        space = cut(v).union(*(cut(u) - own for u in self.operands[v]))
        cost = 0
        for u in self.operands[v]:
            ucls = self.class_set[u]
            have, need = cut(u), space & ucls
            if have != need:
                m = self.pieces(have | need)
                cost += self.nbytes[u] * (m - 1) // m
            cost += self.nbytes[u] * (self.pieces(space - ucls) - 1)
        return cost + self.nbytes[v] * (self.pieces(space - own) - 1)

    def blockwise_cost(self, v: int, cut: Callable[[int], Cut]) -> int:
        """A job's block function: inputs cut into its row blocks, or whole to every task."""
        g = self.graph
        attrs = g.nodes[v].attrs
        assert isinstance(attrs, Blockwise)
        in_rows = attrs.in_rows
        call = blockwise_call(g.nodes[v])
        if any(m.op is Op.BLOCKWISE and blockwise_call(m) == call for m in g.nodes[:v]):
            return 0  # a sibling output of the same tasks, priced once
        first = g.nodes[v].inputs[0]
        tasks = math.ceil(g.nodes[first].shape[0] / in_rows[0]) if in_rows and in_rows[0] else 1
        cost = 0
        for j, u in enumerate(g.nodes[v].inputs):
            rows = in_rows[j] if in_rows else None
            c = self.classes[u][0] if rows else -1  # the class of its rows, when it is cut by rows
            need: frozenset[int] = frozenset((c,)) if rows and self.blocks.get(c, 1) > 1 else frozenset()
            if cut(u) != need or (rows and self.lengths.get(c) != rows):
                m = max(2, self.pieces(cut(u) | need))
                cost += self.nbytes[u] * (m - 1) // m
            if not rows:
                cost += self.nbytes[u] * (min(self.workers, tasks) - 1)
        return cost

    def source_cost(self, s: int, cut: Cut) -> int:
        """A stored array read with cut classes ``cut`` instead of its natural tiling."""
        n = self.graph.nodes[s]
        assert isinstance(n.attrs, Source)
        info: ArrayInfo = n.attrs.array
        natural = frozenset(c for a, c in enumerate(self.classes[s])
                            if info.chunks[a] < n.shape[a] and self.blocks.get(c, 1) > 1)
        cost = 0
        if cut != natural:
            m = self.pieces(cut | natural)
            cost += n.nbytes * (m - 1) // m
        if any(self.lengths[c] % max(1, info.chunks[a]) for a, c in enumerate(self.classes[s]) if c in cut):
            cost += n.nbytes  # blocks straddle chunks: the whole array is read again
        return cost

    def total(self, cut: Callable[[int], Cut]) -> int:
        return sum(self.op_cost(v, cut) for v in range(len(self.graph)))

    # -- the search space: node groups and their candidates ------------------------------------
    def _group_nodes(self) -> None:
        """A transpose is a view (Spartan): it shares its input's tiling, axes permuted.

        ``root[i]`` is the node whose tiling node ``i`` follows; ``root_axis[i][a]`` is the
        axis of the root that axis ``a`` of node ``i`` is.
        """
        g = self.graph
        self.root: list[int] = []
        self.root_axis: list[tuple[int, ...]] = []
        for i, n in enumerate(g.nodes):
            if isinstance(n.attrs, Transpose):
                u = n.inputs[0]
                self.root.append(self.root[u])
                self.root_axis.append(tuple(self.root_axis[u][p] for p in n.attrs.perm))
            else:
                self.root.append(i)
                self.root_axis.append(tuple(range(n.ndim)))
        members: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(self.root):
            members[r].append(i)
        self.groups = sorted(members)
        self.members = dict(members)
        self.options_of: dict[int, list[frozenset[int]]] = {}  # group -> candidate cuts (root axes)
        for r in self.groups:
            if r in self.fixed:  # the program fixed it (map_blocks, store): no choice
                self.options_of[r] = [frozenset(self.fixed[r].axes)]
                continue
            allowed = set(self.cuttable(r))
            for m in members[r]:
                allowed -= {self.root_axis[m][a] for a in self.forbidden[m]}
            axes = sorted(allowed)
            cands = [frozenset((a,)) for a in axes] + [frozenset(p) for p in itertools.combinations(axes, 2)]
            # whole = Spartan's duplicate tiling: one block, copied to the tasks that need it
            if g.nodes[r].nbytes <= self.options.cluster.memory_per_node // 4 or not cands:
                cands.append(frozenset())
            self.options_of[r] = cands

    def node_tiling(self, node: int, root_axes: frozenset[int]) -> Tiling:
        return Tiling(tuple(a for a, r in enumerate(self.root_axis[node]) if r in root_axes))

    def tilings(self, choice: dict[int, int]) -> tuple[Tiling, ...]:
        """Per-node tilings from a candidate index per group."""
        return tuple(self.node_tiling(i, self.options_of[self.root[i]][choice[self.root[i]]])
                     for i in range(len(self.graph)))

    @functools.cached_property
    def factors(self) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """Every op's cost as a table over the candidates of the groups it touches."""
        cuts = {r: [self.cut(r, Tiling(tuple(sorted(axes)))) for axes in self.options_of[r]] for r in self.groups}
        tables: dict[tuple[int, ...], np.ndarray] = {}
        for v, n in enumerate(self.graph.nodes):
            if n.op.from_driver:
                continue
            nodes = [v, *self.operands[v]]
            scope = tuple(sorted({self.root[u] for u in nodes}))
            where = [(u, scope.index(self.root[u])) for u in nodes]
            table = np.empty([len(cuts[r]) for r in scope], dtype=np.int64)
            for idx in itertools.product(*(range(len(cuts[r])) for r in scope)):
                at = {u: cuts[self.root[u]][idx[k]] for u, k in where}
                table[idx] = self.op_cost(v, at.__getitem__)
            tables[scope] = tables[scope] + table if scope in tables else table
        return [(scope, t) for scope, t in tables.items() if t.any()]

    @property
    def free_groups(self) -> list[int]:
        return [r for r in self.groups if len(self.options_of[r]) > 1]


def tiling_model(graph: Graph, options: PlanOptions) -> TilingModel:
    """The (cached) model of ``graph``; it depends on the cluster and block budget only."""
    return _model(graph, PlanOptions(cluster=options.cluster, target_block_bytes=options.target_block_bytes))


@functools.lru_cache(maxsize=64)
def _model(graph: Graph, options: PlanOptions) -> TilingModel:
    return TilingModel(graph, options)


def candidates(graph: Graph, node: int, options: PlanOptions) -> list[Tiling]:
    """The tilings a node may take: each axis, 2-D blocks, whole if it fits a node's memory.

    Only tilings lowering can run, and only distinct ones (cutting a class into one block
    is not cutting it). A transpose follows its input's tiling.
    """
    model = tiling_model(graph, options)
    return [model.node_tiling(node, axes) for axes in model.options_of[model.root[node]]]


def communication_cost(plan_or_graph: Plan | Graph, tilings: tuple[Tiling, ...] | None = None,
                       options: PlanOptions | None = None) -> int:
    """Bytes moved between workers under ``tilings`` (default: the plan's), per ``TilingModel``.

    >>> communication_cost(plan)                  # a tiled plan  # doctest: +SKIP
    >>> communication_cost(graph, tilings, opts)  # any full assignment  # doctest: +SKIP
    """
    if isinstance(plan_or_graph, Plan):
        graph, options = plan_or_graph.graph, options or plan_or_graph.options
        tilings = tilings if tilings is not None else plan_or_graph.tilings
    else:
        graph = plan_or_graph
    if tilings is None or options is None:
        raise ValueError("communication_cost needs tilings and options (or a tiled plan)")
    model = tiling_model(graph, options)
    tilings = tuple(model.fixed.get(i, t) for i, t in enumerate(tilings))  # as with_tilings runs them
    model.check(tilings)
    cuts = [model.cut(i, t) for i, t in enumerate(tilings)]
    return model.total(cuts.__getitem__)
