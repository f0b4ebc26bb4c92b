"""The physical plan: the tasks the runtime runs, exactly as planned.

A task applies a ``Kernel`` to arguments that are blocks of stored arrays
(``SourceBlock``), results of earlier tasks (``TaskResult``) or values the driver
supplies at run time (``DriverValue``, e.g. the current weights). Plans are immutable
and hashable, so iterative jobs cache them by structure and pay for planning once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from arrayjob.io.locations import ArrayInfo, StorageOptions, TableTarget
from arrayjob.planner.kernel import Kernel, KernelBody
from arrayjob.planner.ops import Op, OpAttrs


@dataclass(frozen=True)
class BlockGrid:
    """How an array is cut into blocks: ``block_shape`` per axis, the last block may be short."""

    shape: tuple[int, ...]
    block_shape: tuple[int, ...]

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return tuple(math.ceil(s / b) if s else 0 for s, b in zip(self.shape, self.block_shape, strict=True))

    def indices(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(n) for n in self.grid_shape))

    def selection(self, index: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(
            slice(i * b, min((i + 1) * b, s))
            for i, b, s in zip(index, self.block_shape, self.shape, strict=True)
        )

    @property
    def num_blocks(self) -> int:
        return math.prod(self.grid_shape)


# -- kernel bodies the planner builds (data; ``arrayjob.kernels`` runs them) -----------------


@dataclass(frozen=True)
class Step:
    """One operation of a block kernel: an IR op applied to earlier slots."""

    op: Op
    attrs: OpAttrs
    inputs: tuple[int, ...]  # slots
    dtype: str


@dataclass(frozen=True)
class BlockKernel(KernelBody):
    """A fused group as a straight-line program over slots: the arguments first, then one
    slot per step. Its identity is its structure (constants included), so the workers'
    compiled-program cache is keyed by it."""

    name: str
    n_args: int
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]  # slots returned, in order
    # bytes of its largest input (the whole array) per worker and run: the workers choose
    # compiled loops by the job's size, not the block's (a memory budget cuts the same job
    # into finer blocks, and its loops pay as much as ever)
    worker_bytes: int = 0


Selection = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Assemble(KernelBody):
    """Cut or glue blocks into the block a consumer needs (a re-tiling step).

    ``pieces[k]`` is ``(where the k-th argument's slice lands in the output, which part of
    the k-th argument to take)``, both as tuples of (start, stop) per axis.
    """

    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[tuple[Selection, Selection], ...]


@dataclass(frozen=True)
class Combine(KernelBody):
    """Combine partial results of a reduction: ``sum`` (sums and contractions), ``max``, ``min``."""

    op: str


@dataclass(frozen=True)
class WriteBlock(KernelBody):
    """Write one block into a stored array; the task returns [bytes written, PUTs]. Into a
    Parquet output (a ``TableTarget``): one file, and [bytes written, PUTs, bytes read, GETs],
    the reads those of the input's id column.

    Blocks cover whole chunks, so concurrent writers never touch the same chunk, and a
    retried task rewrites the same bytes (idempotent).
    """

    target: ArrayInfo | TableTarget
    options: StorageOptions
    selection: Selection


@dataclass(frozen=True)
class DeclaredBlock:
    """What a job declared one output of its block function to be (``lazy.map_blocks``): the
    whole output's shape and dtype, and its rows per block (None: one block, the whole)."""

    shape: tuple[int, ...]
    dtype: str
    rows: int | None

    def problem(self, block: object) -> str | None:
        """What is wrong with ``block`` as a block of this output, or None."""
        if self.dtype == "object":  # opaque blocks (a graph's CSR matrices): nothing to compare
            return None
        if not isinstance(block, np.ndarray | np.generic):
            return f"returned a {type(block).__name__}, declared a {self.dtype} array"
        shape = tuple(block.shape)
        if self.rows is None:
            if shape != self.shape:
                return f"returned shape {shape}, declared {self.shape} (one block, the whole output)"
        else:
            last = self.shape[0] - (-(-self.shape[0] // self.rows) - 1) * self.rows
            if len(shape) != len(self.shape) or shape[1:] != self.shape[1:] or shape[0] not in (self.rows, last):
                return f"returned shape {shape}, declared blocks of {self.rows} rows of {self.shape}"
        if str(block.dtype) != self.dtype:
            return f"returned dtype {block.dtype}, declared {self.dtype}"
        return None


@dataclass(frozen=True)
class JobFunction(KernelBody):
    """A user's job's own block function (``lazy.map_blocks``) and what it declared of each
    output: the workers check every block it returns (``arrayjob.kernels``), so a wrong shape
    or dtype is named at the first block, not met later deep in the runtime."""

    fn: Callable[..., object]
    name: str
    outputs: tuple[DeclaredBlock, ...]


@dataclass(frozen=True)
class InputArray:
    """A stored input array, the grid it is read with, and a check each block must pass.

    ``check(block)`` runs where the block is read and returns None or what is wrong with it.
    """

    array: ArrayInfo
    grid: BlockGrid
    check: Kernel | None = None


@dataclass(frozen=True)
class SourceBlock:
    array: str
    index: tuple[int, ...]


@dataclass(frozen=True)
class TaskResult:
    task: str
    output: int = 0  # which of the task's outputs


@dataclass(frozen=True)
class DriverValue:
    name: str
    shape: tuple[int, ...] = ()
    nbytes: int = 0


@dataclass(frozen=True)
class CachedBlock:
    """Block ``position`` of an array the executor keeps (``Session.persist``)."""

    handle: str
    position: int
    shape: tuple[int, ...] = ()
    nbytes: int = 0


Arg = SourceBlock | TaskResult | DriverValue | CachedBlock


@dataclass(frozen=True)
class ReductionStep:
    """Marks a combine task as a step of the reduction tree of one reduced block: every
    task with the same ``tree`` combines partials of the same block. Placement rebuilds
    trees from these marks, never from task ids."""

    tree: str
    level: int


@dataclass(frozen=True)
class Task:
    id: str
    kernel: Kernel
    args: tuple[Arg, ...]
    node: int | None = None  # index into the cluster's node list; None lets Ray choose
    reduction: ReductionStep | None = None  # set on the combine tasks of a reduction tree
    num_outputs: int = 1
    out_shapes: tuple[tuple[int, ...], ...] = ()  # planned shape of each output
    out_bytes: tuple[int, ...] = ()  # planned size of each output, for placement and cost


@dataclass(frozen=True)
class PhysicalPlan:
    sources: tuple[InputArray, ...]
    tasks: tuple[Task, ...]  # in dependency order
    outputs: tuple[TaskResult, ...]  # the results that return to the driver
    # each stored block's bytes once read, found once per block (costing asks per task)
    _block_bytes: dict[SourceBlock, int] = field(default_factory=dict, compare=False, repr=False)

    def source(self, name: str) -> InputArray:
        for s in self.sources:
            if s.array.name == name:
                return s
        raise KeyError(name)

    def node_of(self, position: int, nodes: int) -> int:
        """The node task ``position`` runs on among ``nodes``: its placed node, or, for a task
        Ray places, its position dealt round-robin (as the cost model and the runtime count it)."""
        node = self.tasks[position].node
        return (node if node is not None else position) % max(1, nodes)

    def block_bytes(self, block: SourceBlock) -> int:
        """The bytes stored block ``block`` takes in memory once read (a sparse one: its non-zeros)."""
        found = self._block_bytes.get(block)
        if found is None:
            source = self.source(block.array)
            found = self._block_bytes[block] = source.array.block_nbytes(source.grid.selection(block.index))
        return found

    def density(self, arg: object) -> float:
        """An argument's fraction of non-zeros: a sparse source block's; 1 for anything else."""
        if not isinstance(arg, SourceBlock):
            return 1.0
        source = self.source(arg.array)
        info = source.array
        if info.sparse is None:
            return 1.0
        rows = source.grid.selection(arg.index)[0]
        nnz = info.sparse.nnz_between(rows.start, rows.stop, info.chunks[0], info.shape[0])
        return nnz / max(1, (rows.stop - rows.start) * info.shape[1])

    def block_read_bytes(self, block: SourceBlock) -> int:
        """The bytes reading ``block`` takes from storage: the stored chunks it touches."""
        source = self.source(block.array)
        return source.array.block_reads(source.grid.selection(block.index))[0]

    def block_requests(self, block: SourceBlock) -> int:
        """The GET requests reading ``block`` takes: the stored chunks its selection touches."""
        source = self.source(block.array)
        return source.array.block_reads(source.grid.selection(block.index))[1]

    def block_homes(self, nodes: int) -> dict[SourceBlock, int]:
        """Each stored block's node: that of the first task that uses it (where it is read)."""
        homes: dict[SourceBlock, int] = {}
        for i, task in enumerate(self.tasks):
            for arg in task.args:
                if isinstance(arg, SourceBlock) and arg not in homes:
                    homes[arg] = self.node_of(i, nodes)
        return homes

    def validate(self) -> None:
        """Every argument names a source block, an earlier task or a driver value."""
        seen: set[str] = set()
        grids = {s.array.name: s.grid for s in self.sources}
        for task in self.tasks:
            for arg in task.args:
                if isinstance(arg, TaskResult) and arg.task not in seen:
                    raise ValueError(f"task {task.id}: argument {arg.task} is not an earlier task")
                if isinstance(arg, SourceBlock):
                    grid = grids.get(arg.array)
                    if grid is None or len(arg.index) != len(grid.shape) or any(
                        not 0 <= i < n for i, n in zip(arg.index, grid.grid_shape, strict=True)
                    ):
                        raise ValueError(f"task {task.id}: no block {arg.index} of {arg.array}")
            seen.add(task.id)
        missing = [o for o in self.outputs if o.task not in seen]
        if missing:
            raise ValueError(f"plan output {missing[0].task} is not a task")
