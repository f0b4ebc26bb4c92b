"""The kernel compiler: runs what a task's ``Kernel`` describes, on the workers.

The planner describes each task's body as data (``planner.physical``: ``BlockKernel``,
``Assemble``, ``Combine``, ``WriteBlock``) or carries a job's own block function; ``run``
executes either. Imported by the runtime and by the workers, never by the planner: this
is where numexpr, numba and generated code live.
"""

from __future__ import annotations

import functools
from typing import Any

from arrayjob.io.locations import TableTarget
from arrayjob.kernels.block_kernel import interpret, run_block_kernel
from arrayjob.kernels.primitives import assemble, combine
from arrayjob.planner.physical import Assemble, BlockKernel, Combine, WriteBlock


@functools.singledispatch
def run(body: Any, *args: Any) -> Any:
    """Run a task body on its arguments: a job's block function is called as it is."""
    return body(*args)


run.register(BlockKernel, run_block_kernel)
run.register(Assemble, assemble)
run.register(Combine, combine)


@run.register
def _write(body: WriteBlock, block: Any) -> Any:
    if isinstance(body.target, TableTarget):  # pyarrow, imported only where Parquet is written
        from arrayjob.io.table_writer import write_table_block

        return write_table_block(body.target, body.options, body.selection, block)
    from arrayjob.io.arrays import write_block

    return write_block(body.target, body.options, body.selection, block)


__all__ = ["interpret", "run"]
