"""What the planner and the runtime say about storage without touching it: locations
(URIs), the ``[storage]`` options, request counters and the metadata of a stored array.

Plain data only (no filesystem, Zarr or S3 library), so the planner can import it.
A URI is ``s3://bucket/key``, ``file:///abs/path`` or a local path (relative to the
working directory).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from arrayjob.errors import SpecError


@dataclass(frozen=True)
class StorageOptions:
    """The ``[storage]`` section. Unset fields fall back to the standard AWS environment.

    ``max_attempts`` and ``retry_timeout`` bound the retries of a request that failed
    transiently (5xx, 429, a dropped connection), for every S3 client arrayjob uses: each
    request is tried at most ``max_attempts`` times, and not retried once ``retry_timeout``
    seconds have passed since its first try.
    """

    endpoint_url: str | None = None
    region: str | None = None
    anon: bool = False
    profile: str | None = None
    max_attempts: int = dataclasses.field(default=10, metadata={"check": lambda v: 1 <= v <= 100,
                                                     "expect": "an integer from 1 to 100"})
    retry_timeout: float = dataclasses.field(default=180.0, metadata={"check": lambda v: 0 < v <= 3600,
                                                          "expect": "seconds, more than 0 and at most 3600"})


@dataclass(frozen=True)
class Location:
    """A place in storage: ``scheme`` is "s3" or "file"; ``path`` is "bucket/key" or absolute."""

    scheme: str
    path: str

    def __str__(self) -> str:
        return f"s3://{self.path}" if self.scheme == "s3" else self.path

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    def join(self, *parts: str) -> Location:
        path = "/".join([self.path.rstrip("/"), *(p.strip("/") for p in parts)])
        return dataclasses.replace(self, path=path)

    @property
    def parent(self) -> Location:
        return dataclasses.replace(self, path=self.path.rstrip("/").rsplit("/", 1)[0])

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]


def parse_uri(text: str, *, key: str = "uri", base: str | None = None) -> Location:
    """Parse ``s3://bucket/key``, ``file://path`` or a local path; ``key`` names it in errors.
    A relative local path is taken relative to ``base`` (a directory), else to the working
    directory."""
    text = text.strip()
    if not text:
        raise SpecError(f"{key}: expected a URI (s3://bucket/key, file://path or a path), got an empty string")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        scheme = scheme.lower()
        if scheme in ("s3", "s3a"):
            bucket, _, _ = rest.partition("/")
            if not bucket:
                raise SpecError(f"{key}: {text!r} names no bucket (expected s3://bucket/key)")
            return Location("s3", rest.rstrip("/"))
        if scheme == "file":
            return Location("file", os.path.abspath(os.path.join(base or "", rest)))
        raise SpecError(f"{key}: unsupported URI scheme {scheme!r} in {text!r} (expected s3:// or file://)")
    return Location("file", os.path.abspath(os.path.join(base or "", text)))


@dataclass
class StorageCounters:
    """Requests and bytes, counted by the store that made them."""

    bytes_read: int = 0
    get_requests: int = 0
    bytes_written: int = 0
    put_requests: int = 0

    def add(self, other: StorageCounters) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ArrayInfo:
    """What the planner knows of a stored array: its place, shape, dtype and storage chunks."""

    name: str
    location: Location
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    zarr_format: int
    # what a missing chunk means: "error" (lost data, refused) or "fill" (a sparse array:
    # read as the fill value); ``[inputs]`` sets it per input
    missing_chunks: str = "error"

    @property
    def uri(self) -> str:
        return str(self.location)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)
