"""What a task runs: ``Kernel``, a name and a body, declared below the op vocabulary.

The op vocabulary (``planner.ops``) names kernels (a source's block check, a job's block
function) and the physical plan's kernel bodies (``planner.physical``) name ops, so the
kernel is declared here, beneath both: ``physical`` imports ``ops`` imports ``kernel``,
and nothing imports upward. The bodies the planner builds subclass ``KernelBody``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Work = Mapping[str, float]  # work by kind (``planner.cost.WORK_KINDS``) -> amount


class KernelBody:
    """A kernel body the planner builds as data (``physical.BlockKernel``, ``Assemble``,
    ``Combine``, ``WriteBlock``) and ``arrayjob.kernels.run`` executes on the workers."""

    __slots__ = ()


@dataclass(frozen=True)
class Kernel:
    """What a task runs: a name and a body.

    The body is either a description the kernel compiler runs (a ``KernelBody``: planned
    in ``planner.physical`` and executed by ``arrayjob.kernels.run`` on the workers), or a
    job's own block function. A job's function must be a module-level function or a frozen
    dataclass instance (pickled by reference), and it is part of the kernel's identity: two
    kernels that differ only in a captured constant (``PageRankStep(damping)``) are
    different kernels, so they never share a cached plan.

    ``cost``, for a job's own block function (``lazy.map_blocks``), says what one call does
    from its argument shapes, as work by kind (``{"qr_flops": 4 * n * d * d}``); without
    it the cost model counts one elementwise operation per input element.
    """

    name: str
    fn: Callable[..., object] | KernelBody
    cost: Callable[[Sequence[tuple[int, ...]]], Work] | None = None
