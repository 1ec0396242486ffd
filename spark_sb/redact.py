"""Secret redaction for text and log records.

Runs anywhere (driver, executors, the syphon job). :func:`redact` scrubs connection strings,
``SharedAccessKey=...`` values and ``SharedAccessSignature ... sig=...`` signatures from any text;
:class:`RedactingFilter` applies it to every log record that passes through a handler or logger.
"""

from __future__ import annotations

import logging

REDACTED = "***"


def redact(text: str) -> str:
    """Return ``text`` with every secret replaced by ``***``."""
    raise NotImplementedError


class RedactingFilter(logging.Filter):
    """A :class:`logging.Filter` that redacts secrets from the message and arguments of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        raise NotImplementedError
