"""The kernel compiler: runs what a task's ``Kernel`` describes, on the workers.

The planner describes each task's body as data (``planner.physical``: ``BlockKernel``,
``Assemble``, ``Combine``, ``WriteBlock``) or carries a job's own block function; ``run``
executes either. Imported by the runtime and by the workers, never by the planner: this
is where numexpr, numba and generated code live.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from arrayjob.errors import ArrayJobError, JobCodeError, blames_job
from arrayjob.io.locations import TableTarget
from arrayjob.kernels.block_kernel import interpret, run_block_kernel
from arrayjob.kernels.primitives import assemble, combine
from arrayjob.planner.physical import Assemble, BlockKernel, Combine, JobFunction, WriteBlock

_loops_started = threading.Lock()


def start_loops() -> None:
    """Start numba in this process, in a thread, once: its import takes 0.17 s and its typing and
    LLVM 0.23–0.25 s more at the first compiled loop a process runs; each cached loop then loads
    in milliseconds (``benchmarks/bench_micro.py numba-start``).
    A worker reading a sparse block calls this, so that numba starts while the reads wait on
    storage, not in the job's first iteration."""
    if _loops_started.acquire(blocking=False):
        threading.Thread(target=_start_loops, name="arrayjob-start-loops", daemon=True).start()


def _start_loops() -> None:
    try:
        from arrayjob.kernels import loops

        loops.started(0)
    except Exception:  # noqa: BLE001 - only a head start: the loop that needs numba says what is wrong
        return


@functools.singledispatch
def run(body: Any, *args: Any) -> Any:
    """Run a task body on its arguments: a job's block function is called as it is."""
    return body(*args)


run.register(BlockKernel, run_block_kernel)
run.register(Assemble, assemble)
run.register(Combine, combine)


@run.register
def _job_function(body: JobFunction, *args: Any) -> Any:
    """A user's block function: what it raises, and a block unlike the one it declared, end
    the job as the job's own error (``JobCodeError``) naming its file and line, or the output."""
    module = getattr(body.fn, "__module__", "") or ""
    where = f" (block function {body.name})"
    try:
        out = body.fn(*args)
    except ArrayJobError:
        raise
    except Exception as exc:
        if not blames_job(exc, module):
            raise
        raise JobCodeError.raised(exc, module, module, where) from None
    outs = out if len(body.outputs) > 1 and isinstance(out, tuple) else (out,)
    if len(outs) != len(body.outputs):
        raise JobCodeError(f"job {module}{where}: returned {len(outs)} results, declared {len(body.outputs)}")
    for i, (block, declared) in enumerate(zip(outs, body.outputs, strict=True)):
        problem = declared.problem(block)
        if problem is not None:
            output = f" output {i}" if len(body.outputs) > 1 else ""
            raise JobCodeError(f"job {module}{where}{output}: {problem}")
    return out


@run.register
def _write(body: WriteBlock, block: Any) -> Any:
    if isinstance(body.target, TableTarget):  # pyarrow, imported only where Parquet is written
        from arrayjob.io.table_writer import write_table_block

        return write_table_block(body.target, body.options, body.selection, block)
    from arrayjob.io.arrays import write_block

    return write_block(body.target, body.options, body.selection, block)


__all__ = ["interpret", "run"]
