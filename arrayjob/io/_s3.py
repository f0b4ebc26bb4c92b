"""S3 through obstore (the Rust object_store crate), for every request arrayjob makes.

Zarr stores are zarr's ``ObjectStore`` over an obstore ``S3Store``; whole objects use
obstore's get/put/list/copy/delete. Credentials come from a boto3 session (profile,
environment, instance role); the region from the session, else from the bucket itself
(``_bucket_region``), as s3fs finds it.

Retries are ours, so that they are counted (``backend.count_retries``, reported as
``faults.storage_retries``): object_store's own retrying is turned off (it does not say
when it retried) and every request that fails transiently (a 5xx or 429 answer, a dropped
or refused connection, a timeout) is tried again with jittered exponential backoff, at most
``[storage] max_attempts`` times in all and not after ``retry_timeout`` seconds. botocore
(the bucket region lookup) runs in its standard retry mode with the same ``max_attempts``;
its retries are read from each response's ``RetryAttempts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import os
import random
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

# Imported whole here, once, not inside functions: a first import of boto3 made from two
# threads at once (a worker's reads, obstore's credential callbacks) can meet a half-made
# module ("module 'boto3' has no attribute 'utils'").
import boto3
import botocore.config
import botocore.exceptions
import obstore
from obstore.auth.boto3 import Boto3CredentialProvider
from obstore.exceptions import AlreadyExistsError, BaseError, GenericError
from obstore.store import S3Store
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import ObjectStore, WrapperStore

from arrayjob.io.backend import StorageBackend, count_retries, describe_failure
from arrayjob.io.locations import Location, StorageOptions
from arrayjob.io.transient import transient

T = TypeVar("T")

# concurrent server-side copies when publishing an output (s3fs's default batch size)
_COPY_CONCURRENCY = 32
# the checks before a run (check_reachable, probe_write) answer in seconds: an endpoint
# that does not answer is not retried for object_store's default 3 minutes
_PROBE_CLIENT = {"connect_timeout": dt.timedelta(seconds=5), "timeout": dt.timedelta(seconds=15)}
_PROBE_RETRY = {"max_retries": 2, "retry_timeout": dt.timedelta(seconds=15),
                "backoff": {"init_backoff": dt.timedelta(milliseconds=200), "max_backoff": dt.timedelta(seconds=2)}}


def _backoff(attempt: int) -> float:
    """Full-jitter exponential backoff: up to 0.1 s, 0.2 s, 0.4 s, ... at most 5 s."""
    return random.uniform(0, min(5.0, 0.1 * 2 ** (attempt - 1)))


def _retrying(options: StorageOptions, call: Callable[[], T], *, answered_only: bool = False) -> T:
    """``call()``, tried again after a transient failure (each retry counted)."""
    deadline = time.monotonic() + options.retry_timeout
    attempt = 1
    while True:
        try:
            return call()
        except BaseError as exc:
            delay = _backoff(attempt)
            if (attempt >= options.max_attempts or time.monotonic() + delay > deadline
                    or not transient(exc, answered_only=answered_only)):
                exc.attempts = attempt  # type: ignore[attr-defined]  # named in the error line
                raise
        count_retries()
        time.sleep(delay)
        attempt += 1


async def _retrying_async(options: StorageOptions, call: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + options.retry_timeout
    attempt = 1
    while True:
        try:
            return await call()
        except BaseError as exc:
            delay = _backoff(attempt)
            if attempt >= options.max_attempts or time.monotonic() + delay > deadline or not transient(exc):
                exc.attempts = attempt  # type: ignore[attr-defined]
                raise
        count_retries()
        await asyncio.sleep(delay)
        attempt += 1


class RetryingStore(WrapperStore[Store]):
    """Zarr's ``ObjectStore`` with our counted retries of its reads and writes (chunk
    writes are whole-object PUTs: a retry rewrites the same bytes)."""

    def __init__(self, store: Store, options: StorageOptions) -> None:
        super().__init__(store)
        self.options = options

    def _with_store(self, store: Store) -> RetryingStore:
        return type(self)(store, self.options)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        return await _retrying_async(self.options, lambda: self._store.get(key, prototype, byte_range))

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        return await _retrying_async(self.options, lambda: self._store.get_partial_values(prototype, key_ranges))

    async def set(self, key: str, value: Buffer) -> None:
        await _retrying_async(self.options, lambda: self._store.set(key, value))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        # zarr's ObjectStore ignores "already exists": a retry after a lost answer is safe
        await _retrying_async(self.options, lambda: self._store.set_if_not_exists(key, value))

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        # through our set (WrapperStore hands the batch to the inner store, past the retries)
        await asyncio.gather(*(self.set(key, value) for key, value in values))

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def exists(self, key: str) -> bool:
        return await _retrying_async(self.options, lambda: self._store.exists(key))

    async def delete(self, key: str) -> None:
        await _retrying_async(self.options, lambda: self._store.delete(key))


def _bucket_region(session: Any, bucket: str, options: StorageOptions | None = None) -> str:
    """The AWS region of ``bucket`` from a HEAD request's ``x-amz-bucket-region`` header
    (sent even when the request is redirected or refused). s3fs finds it the same way;
    object_store, under obstore, does not, and signs for the region it is given."""
    options = options or StorageOptions()
    timeout = min(60.0, options.retry_timeout)
    config = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": options.max_attempts},
                                    connect_timeout=timeout, read_timeout=timeout)
    try:
        metadata = session.client("s3", config=config).head_bucket(Bucket=bucket)["ResponseMetadata"]
    except botocore.exceptions.ClientError as exc:
        metadata = exc.response.get("ResponseMetadata", {})
    except botocore.exceptions.BotoCoreError:
        metadata = {}
    count_retries(int(metadata.get("RetryAttempts", 0)))
    return str(metadata.get("HTTPHeaders", {}).get("x-amz-bucket-region", "us-east-1"))


@functools.lru_cache(maxsize=16)
def _store_config(bucket: str, options: StorageOptions) -> dict[str, Any]:
    """The ``S3Store`` arguments for ``bucket``. Cached per process: a boto3 session and,
    without a configured region, a HEAD request are paid once per bucket, not per store."""
    session = boto3.Session(profile_name=options.profile, region_name=options.region)
    endpoint = options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = session.region_name or ("us-east-1" if endpoint else _bucket_region(session, bucket, options))
    # object_store's own retries off: ours are counted (``_retrying``)
    config: dict[str, Any] = {"region": region, "retry_config": {
        "max_retries": 0, "retry_timeout": timedelta(seconds=options.retry_timeout)}}
    if endpoint:
        config.update(endpoint=endpoint, virtual_hosted_style_request=False,
                      client_options={"allow_http": endpoint.startswith("http://")})
    if options.anon or session.get_credentials() is None:
        config["skip_signature"] = True
    else:
        config["credential_provider"] = Boto3CredentialProvider(session)
    return config


@contextlib.contextmanager
def _as_oserror(key: str) -> Iterator[None]:
    """obstore's errors as the backend contract's: missing objects are already
    ``FileNotFoundError``; a refused conditional PUT becomes ``FileExistsError``; any other
    failure an ``OSError`` carrying obstore's first line."""
    try:
        yield
    except AlreadyExistsError as exc:
        raise FileExistsError(f"{key}: {_first_line(exc)}") from None
    except FileNotFoundError:
        raise
    except BaseError as exc:
        raise OSError(f"{key}: {describe_failure(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class S3Backend(StorageBackend):
    """Objects under ``s3://bucket/prefix``."""

    def __init__(self, location: Location, options: StorageOptions) -> None:
        super().__init__(location, options)
        self.bucket, _, self.prefix = location.path.partition("/")
        self._store = S3Store(self.bucket, **_store_config(self.bucket, options))

    def _retry(self, call: Callable[[], T], *, answered_only: bool = False) -> T:
        return _retrying(self.options, call, answered_only=answered_only)

    def _key(self, key: str) -> str:
        return "/".join(p for p in (self.prefix, key) if p)

    def _zarr_store(self, *, read_only: bool) -> Store:
        store = S3Store(self.bucket, prefix=self.prefix or None, **_store_config(self.bucket, self.options))
        return RetryingStore(ObjectStore(store, read_only=read_only), self.options)

    def bucket_exists(self) -> bool:
        try:
            self._retry(lambda: next(iter(obstore.list(self._store, None, chunk_size=1)), None))
        except (BaseError, FileNotFoundError) as exc:
            if "NoSuchBucket" in str(exc):
                return False
            raise
        return True

    def exists(self, key: str = "") -> bool:
        try:
            with _as_oserror(self._key(key)):
                self._retry(lambda: obstore.head(self._store, self._key(key)))
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, key: str = "") -> bytes:
        with _as_oserror(self._key(key)):
            return self._retry(lambda: bytes(obstore.get(self._store, self._key(key)).bytes()))

    def _read_range(self, key: str, start: int, stop: int) -> memoryview:
        if stop <= start:
            return memoryview(b"")
        with _as_oserror(self._key(key)):
            # the response's body as it came, not copied into a ``bytes``
            return self._retry(lambda: memoryview(obstore.get_range(self._store, self._key(key), start=start, end=stop)))

    def _read_tail(self, key: str, length: int) -> tuple[bytes, int]:
        def get() -> tuple[bytes, int]:
            try:
                result = obstore.get(self._store, self._key(key), options={"range": {"suffix": length}})
            except GenericError as exc:
                if "non-partial response" not in str(exc):
                    raise
                # an empty object: the server answers a suffix range with all of it (200, not 206)
                result = obstore.get(self._store, self._key(key))
            data = bytes(result.bytes())
            return data[-length:] if length else b"", int(result.meta["size"])

        with _as_oserror(self._key(key)):
            return self._retry(get)

    def write_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        with _as_oserror(self._key(key)):
            self._retry(lambda: obstore.put(self._store, self._key(key), data, mode="create" if exclusive else "overwrite"),
                        answered_only=exclusive)

    def list(self, prefix: str = "") -> dict[str, int]:
        root = self._key(prefix)
        skip = len(self.prefix) + 1 if self.prefix else 0
        found: dict[str, int] = {}
        with _as_oserror(root or self.bucket):
            batches = self._retry(lambda: list(obstore.list(self._store, root + "/" if root else None)))
            for batch in batches:
                for meta in batch:
                    found[meta["path"][skip:]] = int(meta["size"])
        return dict(sorted(found.items()))

    def move(self, moves: Iterable[tuple[str, str]]) -> int:
        """Server-side copies, many at once, then one batched delete of the sources."""
        pairs = [(self._key(s), self._key(t)) for s, t in moves]
        with _as_oserror(self._key("")):
            if pairs:
                with ThreadPoolExecutor(min(_COPY_CONCURRENCY, len(pairs))) as pool:
                    # list() re-raises the first failure
                    list(pool.map(lambda pair: self._retry(lambda: obstore.copy(self._store, *pair)), pairs))
            self._retry(lambda: obstore.delete(self._store, [s for s, _ in pairs]))  # batched: 1000 keys per request
        return len(pairs)

    def delete(self, prefix: str = "") -> None:
        keys = [self._key(k) for k in self.list(prefix)]
        if self.exists(prefix):
            keys.append(self._key(prefix))
        with _as_oserror(self._key(prefix)):
            self._retry(lambda: obstore.delete(self._store, keys))

    def check_reachable(self) -> None:
        store = self._probe_store()
        with self._probing():
            next(iter(obstore.list(store, self._key("") + "/" if self.prefix else None, chunk_size=1)), None)

    def probe_write(self, key: str) -> int | None:
        store = self._probe_store()
        with self._probing():
            obstore.put(store, self._key(key), b"", mode="create")
            obstore.delete(store, self._key(key))
        return None

    def _probe_store(self) -> S3Store:
        config = dict(_store_config(self.bucket, self.options))
        config["client_options"] = {**config.get("client_options", {}), **_PROBE_CLIENT}
        config["retry_config"] = _PROBE_RETRY
        return S3Store(self.bucket, **config)

    @contextlib.contextmanager
    def _probing(self) -> Iterator[None]:
        """obstore's errors as one line each: the bucket missing, the endpoint not answering,
        access refused; anything else as ``describe_failure`` puts it."""
        try:
            yield
        except (BaseError, FileNotFoundError) as exc:
            raise _probe_failure(exc, self.bucket, _store_config(self.bucket, self.options)) from None


def _probe_failure(exc: BaseException, bucket: str, config: dict[str, Any]) -> OSError:
    """What a failed check found, as an ``OSError`` of the matching kind with one short line."""
    text = str(exc)
    endpoint = config.get("endpoint") or f"S3 in {config['region']}"
    if "NoSuchBucket" in text:
        return FileNotFoundError(f"the bucket {bucket!r} does not exist (at {endpoint})")
    if re.search(r"kind: (Connect|Timeout)|error sending request|timed out", text):
        causes = re.findall(r'message: "([^"]+)"', text)
        waited = re.search(r"elapsed: ([0-9.]+)s", text)
        if causes:
            cause = causes[-1]
        elif waited and re.search(r"Timeout|TimedOut", text):
            cause = f"no answer in {float(waited.group(1)):.0f} s"
        else:
            cause = describe_failure(exc)
        return ConnectionError(f"the S3 endpoint {endpoint} does not answer: {cause}")
    if re.search(r"AccessDenied|403 Forbidden|PermissionDenied|Unauthenticated", text):
        return PermissionError(f"access to the bucket {bucket!r} was refused (at {endpoint}): {describe_failure(exc)}")
    return OSError(describe_failure(exc))
