"""Which storage request failures a retry may cure: the one rule that both the retries of
``io._s3`` and the exit codes (``backend.is_storage_outage``: exit 4, not 2) follow."""

from __future__ import annotations

import re

from obstore.exceptions import GenericError

# a failure worth trying again: the server said so (5xx, 429) or the request never got an answer
_STATUS = re.compile(r"status code: (\d\d\d)\b")
_NO_ANSWER = ("HTTP error", "error sending request", "connection", "timed out", "timeout")


def transient(exc: BaseException, *, answered_only: bool = False) -> bool:
    """Whether ``exc`` is a request failure that a retry may cure. ``answered_only``: only
    when the server answered that it did nothing (for a create-only PUT, which a blind
    retry after a lost answer could find already done)."""
    if not isinstance(exc, GenericError):
        return False  # not found, forbidden, already exists, precondition: retrying changes nothing
    text = str(exc)
    status = _STATUS.search(text)
    if status is not None:
        # the server answered: 5xx, 408, 429 and S3's RequestTimeout (a 400) may pass, any other
        # status is final (obstore's text of a 404 names its retry_timeout too, which the
        # markers below took for no answer)
        code = status.group(1)
        return code[0] == "5" or code in ("408", "429") or "<Code>RequestTimeout</Code>" in text
    return not answered_only and any(marker in text for marker in _NO_ANSWER)
