"""Local disk: a directory is the bucket, keys are relative paths, a move is a rename."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable

from zarr.abc.store import Store
from zarr.storage import LocalStore

from arrayjob.io.backend import StorageBackend


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

    def write_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        path = self._path(key)
        for attempt in range(3):
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except FileExistsError:  # a file where a directory must be: not an exclusive create's refusal
                raise NotADirectoryError(errno.ENOTDIR, "a file stands where a directory goes", os.path.dirname(path)) from None
            try:
                # written beside the target, then put in place whole: readers never see a part
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
                break
            except FileNotFoundError:  # another process pruned the empty directory just now
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
