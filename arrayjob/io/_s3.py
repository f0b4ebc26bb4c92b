"""S3 through obstore (the Rust object_store crate), for every request arrayjob makes.

Zarr stores are zarr's ``ObjectStore`` over an obstore ``S3Store``; whole objects use
obstore's get/put/list/copy/delete. Credentials come from a boto3 session (profile,
environment, instance role); the region from the session, else from the bucket itself
(``_bucket_region``), as s3fs finds it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError
from obstore.store import S3Store
from zarr.abc.store import Store
from zarr.storage import ObjectStore

from arrayjob.io.backend import StorageBackend, describe_failure
from arrayjob.io.locations import Location, StorageOptions

# concurrent server-side copies when publishing an output (s3fs's default batch size)
_COPY_CONCURRENCY = 32
# the checks before a run (check_reachable, probe_write) answer in seconds: an endpoint
# that does not answer is not retried for object_store's default 3 minutes
_PROBE_CLIENT = {"connect_timeout": dt.timedelta(seconds=5), "timeout": dt.timedelta(seconds=15)}
_PROBE_RETRY = {"max_retries": 2, "retry_timeout": dt.timedelta(seconds=15),
                "backoff": {"init_backoff": dt.timedelta(milliseconds=200), "max_backoff": dt.timedelta(seconds=2)}}


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


@functools.lru_cache(maxsize=16)
def _store_config(bucket: str, options: StorageOptions) -> dict[str, Any]:
    """The ``S3Store`` arguments for ``bucket``. Cached per process: a boto3 session and,
    without a configured region, a HEAD request are paid once per bucket, not per store."""
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider

    session = boto3.Session(profile_name=options.profile, region_name=options.region)
    endpoint = options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = session.region_name or ("us-east-1" if endpoint else _bucket_region(session, bucket))
    config: dict[str, Any] = {"region": region}
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
        raise OSError(f"{key}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class S3Backend(StorageBackend):
    """Objects under ``s3://bucket/prefix``."""

    def __init__(self, location: Location, options: StorageOptions) -> None:
        super().__init__(location, options)
        self.bucket, _, self.prefix = location.path.partition("/")
        self._store = S3Store(self.bucket, **_store_config(self.bucket, options))

    def _key(self, key: str) -> str:
        return "/".join(p for p in (self.prefix, key) if p)

    def _zarr_store(self, *, read_only: bool) -> Store:
        store = S3Store(self.bucket, prefix=self.prefix or None, **_store_config(self.bucket, self.options))
        return ObjectStore(store, read_only=read_only)

    def exists(self, key: str = "") -> bool:
        try:
            with _as_oserror(self._key(key)):
                obstore.head(self._store, self._key(key))
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, key: str = "") -> bytes:
        with _as_oserror(self._key(key)):
            return bytes(obstore.get(self._store, self._key(key)).bytes())

    def write_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        with _as_oserror(self._key(key)):
            obstore.put(self._store, self._key(key), data, mode="create" if exclusive else "overwrite")

    def list(self, prefix: str = "") -> dict[str, int]:
        root = self._key(prefix)
        skip = len(self.prefix) + 1 if self.prefix else 0
        found: dict[str, int] = {}
        with _as_oserror(root or self.bucket):
            for batch in obstore.list(self._store, root + "/" if root else None):
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
                    list(pool.map(lambda pair: obstore.copy(self._store, *pair), pairs))
            obstore.delete(self._store, [s for s, _ in pairs])  # batched: 1000 keys per request
        return len(pairs)

    def delete(self, prefix: str = "") -> None:
        keys = [self._key(k) for k in self.list(prefix)]
        if self.exists(prefix):
            keys.append(self._key(prefix))
        with _as_oserror(self._key(prefix)):
            obstore.delete(self._store, keys)

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
