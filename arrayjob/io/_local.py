"""Local disk: a directory is the bucket, keys are relative paths, a move is a rename."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable

from zarr.abc.store import Store
from zarr.storage import LocalStore

from arrayjob.io.backend import StorageBackend

# byte ranges from this size up are mapped (``LocalBackend._read_range``), smaller ones read
MAP_BYTES = 1 << 20


class LocalBackend(StorageBackend):
    """Files under a local directory (``location.path`` is absolute)."""

    def _path(self, key: str) -> str:
        return os.path.join(self.location.path, key) if key else self.location.path

    def _zarr_store(self, *, read_only: bool) -> Store:
        return LocalStore(self.location.path, read_only=read_only)

    def exists(self, key: str = "") -> bool:
        return os.path.isfile(self._path(key))

    def read_bytes(self, key: str = "") -> bytes:
        with open(self._path(key), "rb") as f:
            return f.read()

    def _read_range(self, key: str, start: int, stop: int) -> memoryview:
        """A big range is the file's pages mapped, not read: reading 128 MB of column chunks
        into a ``bytes`` took longer than pyarrow's decoding of them from the mapping (a copy
        out of the page cache, into pages faulted in for it). The view keeps its mapping.
        A file truncated under the mapping would end its reader with SIGBUS (a crashed worker,
        retried, then the job's failure), never with wrong values."""
        with open(self._path(key), "rb") as f:
            stop = min(stop, os.fstat(f.fileno()).st_size)
            if stop - start < MAP_BYTES:
                f.seek(start)
                return memoryview(f.read(max(0, stop - start)))
            offset = start - start % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page
            mapped = mmap.mmap(f.fileno(), stop - offset, offset=offset, access=mmap.ACCESS_READ)
        return memoryview(mapped)[start - offset:]

    def _read_tail(self, key: str, length: int) -> tuple[bytes, int]:
        with open(self._path(key), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - length))
            return f.read(), size

    def write_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        path = self._path(key)
        for attempt in range(3):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                # written beside the target, then put in place whole: readers never see a part
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
                break
            except FileExistsError:  # a file where a directory must be: not an exclusive create's refusal
                raise NotADirectoryError(errno.ENOTDIR, "a file stands where a directory goes",
                                         os.path.dirname(path)) from None
            except FileNotFoundError:  # another process pruned an empty directory on the way just now
                if attempt == 2:
                    raise
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if exclusive:
                os.link(tmp, path)  # fails if path exists: of two creators, one gets FileExistsError
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def list(self, prefix: str = "") -> dict[str, int]:
        root = self._path(prefix)
        found: dict[str, int] = {}
        for directory, _, files in os.walk(root):
            for name in files:
                if name.startswith(".tmp-"):
                    continue  # a write in flight (write_bytes), not an object yet
                path = os.path.join(directory, name)
                try:
                    size = os.path.getsize(path)
                except FileNotFoundError:
                    continue  # deleted since the directory was read
                found[os.path.relpath(path, self.location.path).replace(os.sep, "/")] = size
        return dict(sorted(found.items()))

    def move(self, moves: Iterable[tuple[str, str]]) -> int:
        for source, target in moves:
            path = self._path(target)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.replace(self._path(source), path)
        return 0

    def delete(self, prefix: str = "") -> None:
        path = self._path(prefix)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def prune(self) -> None:
        # bottom-up; rmdir refuses a directory another process has just written into
        for directory, _, _ in os.walk(self.location.path, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(directory)

    def check_reachable(self) -> None:
        if (blocking := _file_in(self.location.path)) is not None:
            where = "a file stands there" if blocking == self.location.path else f"{blocking} is a file"
            raise NotADirectoryError(errno.ENOTDIR, f"{where}; an output is a directory")

    def probe_write(self, key: str) -> int | None:
        self.check_reachable()
        created = _missing_parents(self._path(key))
        try:
            self.write_bytes(key, b"", exclusive=True)
        finally:  # the file, then each directory the write made (rmdir keeps any another run uses)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))
            for directory in created:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        while True:
            with contextlib.suppress(FileNotFoundError):  # removed by another run since it was found
                return shutil.disk_usage(_existing(self.location.path)).free


def _existing(path: str) -> str:
    """``path`` or its nearest ancestor that exists."""
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _file_in(path: str) -> str | None:
    """The file (anything not a directory) at ``path`` or among its ancestors, or None.

    Another run may remove an empty directory between finding it and asking what it is
    (``probe_write`` and ``prune`` do): then the walk up starts again.
    """
    while True:
        found = _existing(path)
        try:
            mode = os.stat(found).st_mode  # one look: a removed-and-remade directory is still a directory
        except FileNotFoundError:
            if os.path.islink(found):
                return found  # a link to nothing
            continue
        return None if stat.S_ISDIR(mode) else found


def _missing_parents(path: str) -> list[str]:
    """The directories above ``path`` that do not exist yet, deepest first."""
    missing = []
    directory = os.path.dirname(path)
    while not os.path.lexists(directory) and os.path.dirname(directory) != directory:
        missing.append(directory)
        directory = os.path.dirname(directory)
    return missing
