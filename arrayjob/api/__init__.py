"""arrayjob's public API: everything a job is written with, the built-in jobs included.

A job is a class: its inputs, a ``Params`` dataclass with checks, the programs it runs
(``stages``) and a ``run`` over a ``JobContext``. Its programs are NumPy-like expressions
over lazy arrays (``from_input(self.arrays["X"]) @ value("w", (d,))``) that arrayjob tiles,
fuses, places and runs on Ray; small state stays NumPy on the driver. Name it in a spec as
``algorithm = "my_package.ridge:Ridge"``, or register it under the entry-point group
``arrayjob.algorithms``. docs/writing-jobs.md is the tutorial and the reference.

Stability: the names in ``__all__`` are the public surface, versioned by ``API_VERSION``
(major.minor). A minor version adds names or keyword arguments; a major version is the only
one that removes or changes them, and the release notes say how to move. Anything else in
``arrayjob`` (``arrayjob.planner``, ``arrayjob.runtime``, ``arrayjob.io``, …) is internal and
may change in any release. ``tests/unit/api/test_user_jobs.py`` checks that the built-in jobs import
nothing else of arrayjob (and ``lint-imports`` enforces it).
"""

from __future__ import annotations

from arrayjob.api.job import (
    EACH_ITERATION,
    ONCE,
    Job,
    JobContext,
    JobResult,
    Pass,
    Runs,
    StagePlan,
    Written,
    require,
    require_features_and_targets,
    require_matrix,
    require_numeric,
)
from arrayjob.errors import InputError, SpecError
from arrayjob.io.arrays import open_array_info, read_block, read_whole
from arrayjob.io.checkpoint import Checkpoint
from arrayjob.io.locations import ArrayInfo, StorageCounters, StorageOptions, parse_uri
from arrayjob.io.model import PublishedModel
from arrayjob.io.sparse import index_outside, index_outside_error, member_info
from arrayjob.lazy import (
    BlockArray,
    absolute,
    asarray,
    cached,
    const,
    einsum,
    erf,
    exp,
    expm1,
    from_numpy,
    from_zarr,
    log,
    log1p,
    logaddexp,
    map_blocks,
    matmul,
    maximum,
    mean,
    minimum,
    negative,
    sigmoid,
    sqrt,
    square,
    sum,
    tanh,
    tensordot,
    transpose,
    value,
    where,
)
from arrayjob.planner.cost import qr_flops
from arrayjob.planner.kernel import Kernel, Work
from arrayjob.planner.tiling import row_grid
from arrayjob.units import size

API_VERSION = "1.0"

# An input of the job as a lazy array: dense Zarr, a sparse CSR group or a Parquet table, as
# the spec names it (its metadata, opened by arrayjob before the job is built).
from_input = from_zarr

__all__ = [
    "API_VERSION",
    # lazy arrays
    "BlockArray", "absolute", "asarray", "cached", "const", "einsum", "erf", "exp", "expm1", "from_input",
    "from_numpy", "log", "log1p", "logaddexp", "map_blocks", "matmul", "maximum", "mean", "minimum", "negative",
    "sigmoid", "sqrt", "square", "sum", "tanh", "tensordot", "transpose", "value", "where",
    # block functions
    "Kernel", "Work", "qr_flops", "row_grid",
    # the job interface
    "EACH_ITERATION", "ONCE", "Job", "JobContext", "JobResult", "Pass", "Runs", "StagePlan", "Written",
    "require", "require_features_and_targets", "require_matrix", "require_numeric",
    # inputs, small arrays read on the driver, checkpoints
    "ArrayInfo", "Checkpoint", "PublishedModel", "StorageCounters", "StorageOptions", "open_array_info",
    "parse_uri", "read_block", "read_whole",
    "index_outside", "index_outside_error", "member_info",
    # errors a job raises
    "InputError", "SpecError",
    # formatting
    "size",
]
