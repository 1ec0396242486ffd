"""Secret redaction for text and log records (SPEC R3: no secret in any log line, exception text or row).

Runs anywhere (driver, executors, the syphon job, the local namespace). :func:`redact` scrubs
``SharedAccessKey=...`` / ``SharedAccessSignature=...`` values of connection strings, the ``sig=`` of
``SharedAccessSignature sr=...&sig=...`` tokens and SAS URLs, ``AccountKey=``, ``client_secret=``/``password=``
style assignments, bearer tokens, and every secret value registered with :func:`register_secret` (the config
registers each resolved :class:`~spark_sb.config.service_bus.Secret`). :class:`RedactingFilter` applies it to every log
record, including its arguments and formatted traceback.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "redact",
    "register_secret",
]

REDACTED = "***"

_KEY_VALUE = re.compile(
    r"(?P<key>\b(?:SharedAccessKey|SharedAccessSignature|AccountKey|Password|Pwd|ClientSecret|client_secret"
    r"|secret|sas_key|access_key)[\"']?\s*[=:]\s*)(?P<q>[\"']?)(?P<val>[^;\s\"'&,}]+)",
    re.IGNORECASE,
)
_SIG = re.compile(r"(?P<key>\bsig=)(?P<val>[^&\s;\"',}]+)", re.IGNORECASE)
_BEARER = re.compile(r"(?P<key>\bBearer\s+)(?P<val>[A-Za-z0-9\-._~+/]+=*)", re.IGNORECASE)

_lock = threading.Lock()
_registered: frozenset[str] = frozenset()
_MIN_REGISTERED_LENGTH = 6  # shorter values would redact ordinary words


def register_secret(value: str | None) -> None:
    """Remember ``value`` so that :func:`redact` removes it wherever it appears. Process-wide, thread-safe."""
    global _registered
    if not value or len(value) < _MIN_REGISTERED_LENGTH:
        return
    with _lock:
        if value not in _registered:
            _registered = _registered | {value}


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with every secret replaced by ``***``.

    ``secrets`` adds literal values to scrub besides the patterns and the registered values.
    """
    if not text:
        return text
    values = [s for s in (*_registered, *secrets) if s]
    # longest first so that a secret containing another is removed whole
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    text = _KEY_VALUE.sub(lambda m: f"{m.group('key')}{m.group('q')}{REDACTED}", text)
    text = _SIG.sub(lambda m: f"{m.group('key')}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m.group('key')}{REDACTED}", text)
    return text


class RedactingFilter(logging.Filter):
    """A :class:`logging.Filter` that redacts secrets from every record it sees.

    Attach it to handlers (``handler.addFilter(RedactingFilter())``) so that records from every logger,
    the Azure SDK's included, are scrubbed: the formatted message (arguments merged in), the exception
    traceback and the stack info. Never drops a record.
    """

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep what there is, redacted
            message = f"{record.msg} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
