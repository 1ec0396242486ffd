"""Unit tests for spark_sb.core.redact (SPEC R3)."""

from __future__ import annotations

import io
import logging

import pytest

from spark_sb.core.redact import (
    REDACTED,
    RedactingFilter,
    redact,
    register_secret,
)

KEY = "q1w2e3r4t5y6u7i8o9p0AbCdEfGhIjKlMnOpQrStUvW="


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        (
            f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={KEY}",
            KEY,
            "SharedAccessKeyName=Root;SharedAccessKey=***",
        ),
        (
            f"Endpoint=sb://127.0.0.1:5671;SharedAccessKeyName=k;SharedAccessKey={KEY};UseDevelopmentEmulator=true",
            KEY,
            "SharedAccessKey=***;UseDevelopmentEmulator=true",
        ),
        (f"sharedaccesskey = {KEY} and more", KEY, "sharedaccesskey = ***"),
        (
            "SharedAccessSignature sr=sb%3a%2f%2fns.servicebus.windows.net&sig=AbC%2bdEf%3d123456&se=1700000000&skn=Root",
            "AbC%2bdEf%3d123456",
            "sig=***&se=1700000000&skn=Root",
        ),
        (
            "Endpoint=sb://ns/;SharedAccessSignature=SharedAccessSignature sr=x&sig=SIGVALUE123&se=1",
            "SIGVALUE123",
            "SharedAccessSignature=***",
        ),
        (
            "https://acct.blob.core.windows.net/c?sv=2020&sig=URLSIG%2Babc&se=2",
            "URLSIG%2Babc",
            "sig=***&se=2",
        ),
        (f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={KEY};", KEY, "AccountKey=***;"),
        ("Authorization: Bearer eyJhbGciOi.eyJzdWIiOi.SflKxwRJSMeKKF2QT4fw", "eyJhbGciOi", "Bearer ***"),
        ("client_secret='hunter2hunter2' tenant=t", "hunter2hunter2", "client_secret='***' tenant=t"),
        ('{"client_secret": "abcDEF123456"}', "abcDEF123456", None),
    ],
)
def test_redact_patterns(text: str, secret: str, kept: str | None) -> None:
    out = redact(text)
    assert secret not in out
    assert REDACTED in out
    if kept is not None:
        assert kept in out


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "sent 10 messages to orders (key name RootManageSharedAccessKey), secret redaction on"
    assert redact(text) == text
    assert redact("") == ""


def test_registered_and_explicit_secrets() -> None:
    register_secret("Zx9-registered-value-Qw")
    register_secret("abc")  # too short: would redact ordinary words, ignored
    assert redact("value Zx9-registered-value-Qw here") == "value *** here"
    assert redact("abc") == "abc"
    assert redact("token plain-literal-token", secrets=["plain-literal-token"]) == "token ***"


def _capture(logger_name: str) -> tuple[logging.Logger, logging.Handler, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger(logger_name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    return logger, handler, stream


def test_filter_redacts_message_args_traceback_and_stack() -> None:
    logger, handler, stream = _capture("test_redact.filter")
    try:
        logger.info("connecting with %s", f"SharedAccessKey={KEY}")
        logger.warning("dict arg %(cs)s", {"cs": f"AccountKey={KEY}"})
        try:
            raise ConnectionError(f"refused: Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey={KEY}")
        except ConnectionError:
            logger.exception("send failed")
        logger.info("with stack SharedAccessKey=%s", KEY, stack_info=True)
        logger.info("broken format %s %s", "only-one")  # must not raise nor drop the record
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert KEY not in out
    assert "connecting with SharedAccessKey=***" in out
    assert "AccountKey=***" in out
    assert "ConnectionError" in out and "Traceback" in out
    assert "Stack (most recent call last)" in out
    assert "broken format" in out
