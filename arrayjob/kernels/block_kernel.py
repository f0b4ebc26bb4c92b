"""Running a ``BlockKernel`` on the workers: compiled once per shapes and cached, or interpreted.

A ``BlockKernel`` evaluates a fused subgraph of the IR on one block of each of its inputs
and returns the blocks (or partial results) of the nodes it materialises. It arrives on a
worker by pickling and is compiled there on first use (``compiler.Program``: numexpr
expressions, row loops, row sub-blocking), once per argument shapes and dtypes;
``interpret`` runs it one NumPy call per step (the reference the tests compare with).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from arrayjob.kernels import sparse
from arrayjob.kernels.compiler import Program, last_uses
from arrayjob.kernels.primitives import evaluate
from arrayjob.planner.physical import BlockKernel

Signature = tuple[tuple[tuple[int, ...], str, str | None], ...]


class CompiledPrograms:
    """The programs compiled in this process, by kernel structure and argument signature.

    The key is the whole ``BlockKernel`` (its steps, constants included) and the shapes,
    dtypes and sparse formats of the arguments: everything a compiled program's results
    depend on (a sparse block's count of non-zeros only decides, on the first block, whether
    a row loop pays). A worker unpickles a fresh copy of the kernel for every task and must
    not compile it again; the least recently used kernels are dropped past ``capacity``.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._programs: OrderedDict[BlockKernel, dict[Signature, Any]] = OrderedDict()

    def get(self, kernel: BlockKernel, args: tuple[Any, ...]) -> Any:
        signature = tuple((tuple(np.shape(a)), str(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype),
                           a.format if sparse.issparse(a) else None) for a in args)
        programs = self._programs.pop(kernel, None) or {}
        self._programs[kernel] = programs
        while len(self._programs) > self.capacity:
            self._programs.popitem(last=False)
        program = programs.get(signature)
        if program is None:
            program = programs[signature] = Program(kernel, args)
        return program


PROGRAMS = CompiledPrograms()  # this worker process's


def run_block_kernel(kernel: BlockKernel, *args: Any) -> Any:
    return _result(kernel, PROGRAMS.get(kernel, args)(args))


def interpret(kernel: BlockKernel, *args: Any) -> Any:
    """One NumPy call per step, every intermediate materialised (the reference)."""
    slots: list[Any] = list(args)
    done_after = last_uses([step.inputs for step in kernel.steps], keep={*kernel.outputs, *range(kernel.n_args)})
    for step, done in zip(kernel.steps, done_after, strict=True):
        slots.append(evaluate(step, [slots[i] for i in step.inputs]))
        for slot in done:
            slots[slot] = None
    return _result(kernel, [slots[o] for o in kernel.outputs])


def _result(kernel: BlockKernel, values: list[Any]) -> Any:
    return values[0] if len(kernel.outputs) == 1 else tuple(values)
