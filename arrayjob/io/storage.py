"""Where bytes live: URIs, storage options, filesystems and Zarr stores that count their requests.

A URI is ``s3://bucket/key``, ``file:///abs/path`` or a local path (relative to the
working directory). Every Zarr store arrayjob opens is wrapped in a ``CountingStore``
so that bytes and requests are counted where they happen, on whichever process does
the I/O, and reported back with the task's result.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import fsspec
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from arrayjob.io.locations import Location, StorageCounters, StorageOptions


@functools.lru_cache(maxsize=16)
def filesystem(scheme: str, options: StorageOptions) -> fsspec.AbstractFileSystem:
    """A synchronous fsspec filesystem for listing, moving and deleting whole objects."""
    if scheme == "s3":
        return fsspec.filesystem("s3", **options.s3fs_kwargs())
    return fsspec.filesystem("file", auto_mkdir=True)


class CountingStore(WrapperStore[Store]):
    """A Zarr store that counts the GET and PUT requests and bytes of the store it wraps."""

    def __init__(self, store: Store, counters: StorageCounters | None = None) -> None:
        super().__init__(store)
        self.counters = counters if counters is not None else StorageCounters()

    def _with_store(self, store: Store) -> CountingStore:
        return type(self)(store, self.counters)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        self.counters.get_requests += 1
        if value is not None:
            self.counters.bytes_read += len(value)
        return value

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        values = await self._store.get_partial_values(prototype, key_ranges)
        self.counters.get_requests += len(key_ranges)
        self.counters.bytes_read += sum(len(v) for v in values if v is not None)
        return values

    async def set(self, key: str, value: Buffer) -> None:
        await self._store.set(key, value)
        self.counters.put_requests += 1
        self.counters.bytes_written += len(value)

    async def exists(self, key: str) -> bool:
        self.counters.get_requests += 1  # a HEAD request on S3
        return await self._store.exists(key)


def _bucket_region(session: Any, bucket: str) -> str:
    """The AWS region of ``bucket`` from a HEAD request's ``x-amz-bucket-region`` header
    (sent even when the request is redirected or refused). s3fs finds it the same way;
    object_store, under obstore, does not, and signs for the region it is given."""
    import botocore.exceptions

    try:
        headers = session.client("s3").head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPHeaders"]
    except botocore.exceptions.ClientError as exc:
        headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    except botocore.exceptions.BotoCoreError:
        headers = {}
    return str(headers.get("x-amz-bucket-region", "us-east-1"))


def _s3_block_store(location: Location, options: StorageOptions) -> Store:
    """A read-only S3 store through obstore (the Rust object_store crate) for block reads.

    Measured on loopback S3 (2 cores, ``benchmarks/bench_micro.py s3-block``): one 256 MiB
    block of 16 MiB chunks in 0.22 s, against 0.47 s through s3fs/aiohttp; the block reads of a job are its load stage. Credentials
    come from a boto3 session (profile, environment, instance role), as for s3fs; the
    region from the session, else from the bucket itself (``_bucket_region``).
    """
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider
    from obstore.store import S3Store
    from zarr.storage import ObjectStore

    bucket, _, prefix = location.path.partition("/")
    session = boto3.Session(profile_name=options.profile, region_name=options.region)
    endpoint = options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = session.region_name or ("us-east-1" if endpoint else _bucket_region(session, bucket))
    kwargs: dict[str, Any] = {"prefix": prefix, "region": region}
    if endpoint:
        kwargs.update(endpoint=endpoint, virtual_hosted_style_request=False,
                      client_options={"allow_http": endpoint.startswith("http://")})
    if options.anon or session.get_credentials() is None:
        kwargs["skip_signature"] = True
    else:
        kwargs["credential_provider"] = Boto3CredentialProvider(session)
    return ObjectStore(S3Store(bucket, **kwargs), read_only=True)


def zarr_store(
    location: Location,
    options: StorageOptions,
    *,
    read_only: bool,
    counters: StorageCounters | None = None,
    for_blocks: bool = False,
) -> CountingStore:
    """Open the Zarr store at ``location``, counting its requests into ``counters``.

    ``for_blocks``: a read-only store for a worker's block reads (obstore on S3, see
    ``_s3_block_store``); metadata, listings and writes go through s3fs.
    """
    store: Store
    if location.is_s3 and for_blocks and read_only:
        store = _s3_block_store(location, options)
    elif location.is_s3:
        store = FsspecStore.from_url(
            f"s3://{location.path}", storage_options=options.s3fs_kwargs(), read_only=read_only
        )
    else:
        store = LocalStore(location.path, read_only=read_only)
    return CountingStore(store, counters)


def quiet_async_teardown() -> None:
    """Drop one known piece of noise: after a failed S3 request, aiobotocore leaves a
    coroutine that Python finalises at exit in another context, printing "Exception ignored
    in: <coroutine …>" with a ValueError from contextvars. It follows a one-line error and
    says nothing more, so it is not printed; every other unraisable error still is."""
    import sys

    default = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        exc, obj = unraisable.exc_value, unraisable.object
        text = f"{type(obj).__module__}.{getattr(obj, '__qualname__', '')}"
        if isinstance(exc, ValueError) and "was created in a different Context" in str(exc) and (
            "coroutine" in type(obj).__name__ or "botocore" in text or "zarr" in text or "s3fs" in text
        ):
            return
        default(unraisable)

    sys.unraisablehook = hook
