"""What every job is: declared inputs and params, a shape check, the programs it runs
(``StagePlan``), and a run over an executor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from arrayjob.errors import InputError
from arrayjob.io.arrays import ResultGroup, read_whole
from arrayjob.io.checkpoint import Checkpoint, Checkpoints
from arrayjob.io.locations import ArrayInfo, Location, StorageCounters, StorageOptions, TableTarget
from arrayjob.io.model import PublishedModel
from arrayjob.lazy import BlockArray, store
from arrayjob.runtime.metrics import RunMetrics
from arrayjob.runtime.session import Session


@dataclass(frozen=True)
class Runs:
    """How many times a program runs in a job: ``once`` times, plus ``per_iteration`` times
    in each iteration (an estimate assumes ``Job.iterations_assumed``; a run takes its own)."""

    once: int = 1
    per_iteration: int = 0

    def times(self, iterations: int) -> int:
        return self.once + self.per_iteration * iterations


ONCE = Runs()
EACH_ITERATION = Runs(once=0, per_iteration=1)


@dataclass(frozen=True)
class Written:
    """An output of a pass the workers write into the result, block by block (``lazy.store``):
    the array it is written into. A run creates it in result.zarr; an estimate plans the same
    writes without creating anything. ``rows``: the input whose rows these are, one value (or
    row of values) per input row, for a per-row output (KMeans' labels): with ``[output]
    format = "parquet"`` it is written as a Parquet dataset beside result.zarr instead, with
    that input's id column, if it has one (``table``)."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    rows: ArrayInfo | None = None

    def table(self, name: str, prefix: Location) -> TableTarget:
        """Where the run whose files are under ``prefix`` writes this output as Parquet:
        ``<prefix>/<name>/part-*.parquet``."""
        assert self.rows is not None, f"{name}: not a per-row output"
        return TableTarget(name, prefix.join(name), self.shape, self.dtype, self.chunks, self.rows.ids())

    def target(self, name: str, result: Location, output_format: str) -> ArrayInfo | TableTarget:
        """What the workers write into, for a run whose result.zarr is at ``result``: a Zarr array
        in it (as ``ResultGroup.create_array`` creates it), or a Parquet dataset beside it."""
        if output_format == "parquet" and self.rows is not None:
            return self.table(name, result.parent)
        return ArrayInfo(name, result.join(name), self.shape, str(np.dtype(self.dtype)), self.chunks, 3)


@dataclass(frozen=True)
class Pass:
    """One program a job runs: its name (how ``run`` asks for it), the stage of the run it
    runs in (the report's ``load``, ``fit``, …) and how many times; ``keeps``, the handle
    ``Session.persist`` keeps its outputs under, if it does (later passes read them as
    ``lazy.cached("<keeps>:<output>")``); ``releases``, the handles of kept arrays the job
    releases once this pass has run (their room goes to what is in the spill); ``writes``, the
    outputs the workers write into the result instead of returning them."""

    name: str
    stage: str
    program: Mapping[str, BlockArray]
    runs: Runs = ONCE
    keeps: str | None = None
    releases: tuple[str, ...] = ()
    writes: Mapping[str, Written] = field(default_factory=dict)  # outputs the workers write

    def writing(self, targets: Mapping[str, ArrayInfo | TableTarget],
                storage: StorageOptions) -> dict[str, BlockArray]:
        """The program as a run executes it: each output in ``writes`` written by the workers
        into its target, computing to [bytes written, PUT requests] under the same name."""
        return {name: store(x, targets[name], storage) if name in self.writes else x
                for name, x in self.program.items()}


@dataclass(frozen=True)
class StagePlan:
    """Every program a job runs, in the order it runs them: ``run`` executes these programs
    and ``costing.estimate`` prices them, so the two cannot drift apart.

    Stored blocks are read in ``load`` before any other work; a pass in ``load`` is priced
    there with them (PageRank's graph build, KMeans' statistics). Outputs the workers write
    are added by ``run`` (``lazy.store`` of a declared output) and priced from
    ``Job.outputs_estimate``.
    """

    passes: tuple[Pass, ...]

    def __post_init__(self) -> None:
        names = [p.name for p in self.passes]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"StagePlan: expected distinct pass names, got {names}")

    def pass_named(self, name: str) -> Pass:
        for p in self.passes:
            if p.name == name:
                return p
        raise KeyError(f"no pass {name!r} (passes: {', '.join(p.name for p in self.passes)})")

    def __getitem__(self, name: str) -> dict[str, BlockArray]:
        """The program of pass ``name``, as a fresh dict a run may extend (e.g. with a store)."""
        return dict(self.pass_named(name).program)

    def stage_of(self, name: str) -> str:
        return self.pass_named(name).stage

    @property
    def main(self) -> Pass:
        """The pass ``arrayjob plan`` shows: the first that runs every iteration, else the last."""
        return next((p for p in self.passes if p.runs.per_iteration), self.passes[-1])


class JobContext:
    """What a running job may use, and all it may use: the workers it plans for, its programs
    run (``compute``, ``load``, ``persist``, ``release``), small arrays read on the driver
    (``read_whole``), its stages and progress (``stage``, ``iteration``), its checkpoints
    (``restore``, ``checkpoint``) and the outputs the workers write (``writing``,
    ``count_writes``). The session, metrics and checkpoints behind it are arrayjob's own:
    a job that reached past these methods would break when they change."""

    def __init__(self, session: Session, metrics: RunMetrics, storage: StorageOptions | None = None,
                 result: ResultGroup | None = None, checkpoints: Checkpoints | None = None,
                 output_format: str = "zarr") -> None:
        self._session = session
        self._metrics = metrics
        self._result = result  # where big outputs are written by the workers
        self._checkpoints = checkpoints if checkpoints is not None else Checkpoints()
        self._targets: dict[str, ArrayInfo | TableTarget] = {}
        self.storage = storage or StorageOptions()  # how the inputs' storage is reached
        self.output_format = output_format  # ``[output] format``: "parquet" writes per-row outputs as tables

    @property
    def workers(self) -> int:
        """The workers (CPUs) the run plans for: what ``Job.stages`` is given."""
        return self._session.options.cluster.workers

    @property
    def writes_result(self) -> bool:
        """Whether this run has a result.zarr the workers write big outputs into (``writing``).
        False when a job is run in-process without one (a test's run): return the outputs as
        arrays of the ``JobResult`` instead."""
        return self._result is not None

    def compute(self, outputs: Mapping[str, BlockArray], values: Mapping[str, Any] | None = None
                ) -> dict[str, np.ndarray]:
        """Plan (cached by the program's structure) and run ``outputs``; ``values`` binds each
        ``value(name, ...)`` of the program. Returns the outputs as NumPy arrays."""
        return self._session.compute(outputs, values)

    def load(self, outputs: Mapping[str, BlockArray]) -> None:
        """Read the stored blocks ``outputs`` need into the workers' memory, before the fit."""
        self._session.load(outputs)

    def persist(self, outputs: Mapping[str, BlockArray], values: Mapping[str, Any] | None = None,
                handle: str | None = None) -> dict[str, BlockArray]:
        """Run ``outputs`` and keep their blocks on the workers; later programs read them as
        the returned lazy arrays (or as ``cached("<handle>:<output>")``). ``release`` frees them."""
        return self._session.persist(outputs, values, handle)

    def release(self, arrays: Mapping[str, BlockArray]) -> None:
        """Free the kept blocks of ``arrays`` (made by ``persist``)."""
        self._session.release(arrays)

    def read_whole(self, info: ArrayInfo) -> np.ndarray:
        """Read a small input (initial centroids, a model's coefficients) on the driver, its
        bytes and requests counted in the report."""
        return read_whole(info, self.storage, self._metrics)

    def stage(self, name: str) -> Any:
        """``with ctx.stage("fit"):`` — time and count what runs inside as that stage of the
        report. Use the stage names the job's ``StagePlan`` declares."""
        return self._metrics.stage(name)

    def iteration(self, iteration: int, max_iter: int, **figures: float) -> None:
        """Report progress: ``iteration`` (from 1) of at most ``max_iter``, with named figures
        (floats) such as ``objective=``, ``gradient_norm=`` or ``shift=``; each is shown in the
        progress line and kept in the report's iteration history."""
        self._metrics.iteration(iteration, max_iter, **figures)

    def restore(self) -> Checkpoint | None:
        """The checkpoint a dead run of this spec left, to go on from (call once, after load)."""
        return self._checkpoints.restore()

    def checkpoint(self, iteration: int, state: Mapping[str, Any]) -> None:
        """The end of ``iteration``: save ``state`` (NumPy arrays and JSON scalars) if due
        (``[run] checkpoint_every``)."""
        self._checkpoints.tick(iteration, dict(state))

    def writing(self, p: Pass) -> dict[str, BlockArray]:
        """The program of ``p`` with its ``writes`` written by the workers into result.zarr (each
        array created once per run), or a per-row output, if the output's format is Parquet,
        as ``<name>/part-*.parquet`` beside it (``Written.target``)."""
        assert self._result is not None, f"pass {p.name} writes {', '.join(p.writes)}: the run needs a result"
        for name, w in p.writes.items():
            if name in self._targets:
                continue
            target = w.target(name, self._result.location, self.output_format)
            if isinstance(target, TableTarget):
                self._targets[name] = target
            else:
                self._targets[name] = self._result.create_array(name, shape=w.shape, chunks=w.chunks, dtype=w.dtype)
        return p.writing(self._targets, self.storage)

    def count_writes(self, p: Pass, results: Mapping[str, np.ndarray]) -> int:
        """Count what writing ``p``'s outputs took (``results``: the program ``writing`` gave,
        computed) into the run's metrics; returns the bytes written."""
        written = 0
        for name in p.writes:
            counts = [int(c) for c in results[name]] + [0, 0]
            self._metrics.count_storage(StorageCounters(bytes_written=counts[0], put_requests=counts[1],
                                                       bytes_read=counts[2], get_requests=counts[3]))
            written += counts[0]
        return written


@dataclass
class JobResult:
    """Small outputs (written to result.zarr by the driver), fit metrics, and summary lines."""

    arrays: dict[str, np.ndarray]
    attrs: dict[str, Any]
    summary: list[str] = field(default_factory=list)


class Job(ABC):
    """A job: its ``inputs`` (the spec's ``[inputs]`` keys), its ``Params`` (a dataclass the
    spec's ``[params]`` fill; a field's ``metadata`` may hold ``check`` and ``expect``), a
    check of the inputs' shapes (``check_inputs``), the programs it runs (``stages``) and the
    run itself (``run``). ``name`` and ``title`` default to the class's name."""

    name: ClassVar[str]
    title: ClassVar[str]
    inputs: ClassVar[tuple[str, ...]]
    optional_inputs: ClassVar[tuple[str, ...]] = ()
    sparse_inputs: ClassVar[tuple[str, ...]] = ()  # inputs that may be sparse matrices (CSR groups)
    # of those, the ones read as their pattern (``io.sparse``): values never read, ``data`` and
    # ``encoding-type`` not needed (PageRank's adjacency)
    pattern_inputs: ClassVar[tuple[str, ...]] = ()
    # inputs that name a published arrayjob output, not an array: opened as models (``io.model``)
    model_inputs: ClassVar[tuple[str, ...]] = ()
    # the input whose rows the job's per-row outputs follow (KMeans' labels: X), which
    # ``[output] format = "parquet"`` writes as tables with its id column; None: it has none
    row_input: ClassVar[str | None] = None
    Params: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__ and not hasattr(cls, "name"):
            cls.name = cls.__name__.lower()
        if "title" not in cls.__dict__ and not hasattr(cls, "title"):
            cls.title = cls.__name__

    def __init__(self, params: Any, arrays: Mapping[str, ArrayInfo], storage: StorageOptions | None = None,
                 models: Mapping[str, PublishedModel] | None = None) -> None:
        self.params = params
        self.arrays = dict(arrays)
        self.storage = storage or StorageOptions()
        self.models = dict(models or {})
        # what opening the inputs read beyond their metadata (a sparse input's indptr), counted
        # by a run and priced by an estimate as part of the job's reads
        self.metadata_reads = StorageCounters()
        self.check_inputs()

    @abstractmethod
    def check_inputs(self) -> None:
        """Raise InputError naming the array when shapes or dtypes do not fit."""

    @classmethod  # noqa: B027 - a hook most jobs leave empty
    def check_shape(cls, name: str, shape: tuple[int, ...], models: Mapping[str, PublishedModel]) -> None:
        """Raise InputError when input ``name``'s shape cannot fit the job's ``models``: called by
        ``runner.open_inputs`` as soon as the shape is known, before anything of the input is read
        (a sparse input's ``indptr``). Most jobs have no models and check nothing here."""

    @abstractmethod
    def stages(self, workers: int) -> StagePlan:
        """Every program this job runs on ``workers`` workers, in which stage, how many times."""

    def program(self, workers: int = 2) -> dict[str, BlockArray]:
        """The program of one pass (one iteration) over the inputs: ``StagePlan.main``."""
        return dict(self.stages(workers).main.program)

    def iterations_assumed(self, iterations: int | None = None) -> tuple[int, str]:
        """How many iterations an estimate assumes, and why."""
        max_iter = getattr(self.params, "max_iter", None)
        if max_iter is None:
            return 1, "a single pass"
        if iterations:
            return iterations, "--iterations"
        return max_iter, "params.max_iter, an upper bound"

    def outputs_estimate(self) -> list[tuple[tuple[int, ...], str, int | None]]:
        """The arrays a run writes: (shape, dtype, chunk rows or None for one chunk)."""
        return []

    def output_bytes(self) -> int:
        """The bytes of the arrays a run writes (``outputs_estimate``), uncompressed."""
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                   for shape, dtype, _ in self.outputs_estimate())

    @abstractmethod
    def run(self, ctx: JobContext) -> JobResult: ...

    def describe(self) -> str:
        """One line: what this job does to what."""
        shapes = ", ".join(f"{n} {' × '.join(f'{s:,}' for s in a.shape)}" for n, a in self.arrays.items())
        return f"{self.title} on {shapes}"


def check_tables(job: Job, output_format: str) -> None:
    """Before a run: each per-row output written as Parquet can hold its rows' id column
    beside it (the two columns must have different names)."""
    if output_format != "parquet":
        return
    for p in job.stages(1).passes:
        for name, w in p.writes.items():
            ids = w.rows.ids() if w.rows is not None else None
            if ids is not None and ids.table is not None and ids.table.columns[0] == name:
                raise InputError(f"inputs.{w.rows.name if w.rows else 'X'}.id_column: {name!r} is also the name "
                                 f"of the output column written beside it ({name}/part-*.parquet); rename one")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)


def require_numeric(info: ArrayInfo) -> None:
    require(np.dtype(info.dtype).kind in "biuf", f"inputs.{info.name}: expected a numeric array, got dtype {info.dtype}")


def require_matrix(X: ArrayInfo) -> None:
    """``X`` is a numeric (n, d) matrix with n, d > 0 (rows × features)."""
    require(X.ndim == 2, f"inputs.{X.name}: expected a 2-D array (rows × features), got shape {X.shape}")
    require(X.shape[0] > 0 and X.shape[1] > 0,
            f"inputs.{X.name}: expected at least one row and one column, got shape {X.shape}")
    require_numeric(X)


def require_features_and_targets(arrays: Mapping[str, ArrayInfo]) -> None:
    """X is a numeric (n, d) matrix with n, d > 0 and y a numeric (n,) or (n, 1) vector."""
    X, y = arrays["X"], arrays["y"]
    require_matrix(X)
    require_numeric(y)
    require(y.shape in ((X.shape[0],), (X.shape[0], 1)),
            f"inputs.y: expected shape ({X.shape[0]},) to match the rows of inputs.X {X.shape}, got {y.shape}")
