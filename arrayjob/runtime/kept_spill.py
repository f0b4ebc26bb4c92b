"""Kept blocks on a node's local disk, read back in place.

A kept block (``Session.persist``: PageRank's graph) that does not fit the memory budget is
written by the task that made it to its node's spill, and every later task that uses it
reads the file itself, inside the task, without bringing it into the object store.

The file is the block pickled with protocol 5 and its buffers out of band (PEP 574): the
pickle stream first, then each buffer (a NumPy array's data: a CSR block's ``data``,
``indices`` and ``indptr``) at a 64-byte aligned offset. Reading maps the file and hands
pickle views of the mapping, so the arrays come back read-only and uncopied, from the
page cache, as blocks from the object store do (Ray stores objects the same way). Any
object pickle can handle works; only buffers of contiguous arrays are mapped, the rest is
in the pickle stream.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

ALIGN = 64
MAPPED_BYTES = 2**30  # kept blocks a worker process keeps mapped between its tasks
_HEADER = struct.Struct("<8sQQ")  # magic, pickle bytes, buffers
_LENGTH = struct.Struct("<Q")
MAGIC = b"AJKEPT01"


class KeptBlockLost(OSError):
    """A kept block's spill file is not on the node that reads it (its node is gone)."""


@dataclass(frozen=True)
class KeptFile:
    """A kept block in the spill of node ``node``: what tasks are given instead of the block."""

    path: str
    node: str  # the Ray node id whose disk holds ``path``
    nbytes: int  # the block's bytes, as the runtime counts a block (``_nbytes``)

    def read(self) -> Any:
        try:
            return _mapped.get(self.path, self.nbytes)
        except FileNotFoundError:
            raise KeptBlockLost(f"kept block {os.path.basename(self.path)} is not on this node "
                                f"(it was spilled on node {self.node[:12]})") from None


class _Mapped:
    """The kept blocks this worker process has mapped, kept between its tasks: an iterative
    job's next task on the same block finds it mapped and its pages faulted in already
    (the page cache's, shared, not the process's own memory), up to ``MAPPED_BYTES``, the
    least recently used dropped first. A block whose file is gone (released, or the job's
    spill removed) is dropped at the next read, so its pages are not held past it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.blocks: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.bytes = 0

    def get(self, path: str, nbytes: int) -> Any:
        for held in [p for p in self.blocks if p != path and not os.path.exists(p)]:
            self.bytes -= self.blocks.pop(held)[1]
        if path in self.blocks and os.path.exists(path):
            self.blocks.move_to_end(path)
            return self.blocks[path][0]
        obj = read(path)
        if nbytes <= self.limit:
            self.blocks[path] = (obj, nbytes)
            self.bytes += nbytes
            while self.bytes > self.limit:
                self.bytes -= self.blocks.popitem(last=False)[1][1]
        return obj


_mapped = _Mapped(MAPPED_BYTES)


def _padding(offset: int) -> int:
    return -offset % ALIGN


def write(path: str, obj: Any) -> int:
    """Write ``obj`` to ``path`` (atomically: a partial file is never seen); returns the file's bytes."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as f:
        f.write(_HEADER.pack(MAGIC, len(stream), len(buffers)))
        f.write(stream)
        for buffer in buffers:
            raw = buffer.raw()
            f.write(_LENGTH.pack(raw.nbytes))
            f.write(b"\0" * _padding(f.tell()))
            f.write(raw)
        size = f.tell()
    os.replace(partial, path)
    return size


def read(path: str) -> Any:
    """The object ``write`` wrote to ``path``; its buffers are views of the mapped file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    view = memoryview(mapped)
    magic, stream_bytes, count = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise ValueError(f"{path}: not a kept block")
    offset = _HEADER.size
    stream = view[offset:offset + stream_bytes]
    offset += stream_bytes
    buffers = []
    for _ in range(count):
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        offset += _padding(offset)
        buffers.append(view[offset:offset + length])
        offset += length
    return pickle.loads(stream, buffers=buffers)
