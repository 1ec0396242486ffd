"""Provisioning against an endpoint whose TLS certificate is not trusted (CERTIFICATE_VERIFY_FAILED) says how to
trust it, and does not retry what no retry can fix. The local namespace serves its admin endpoint over TLS with
its own development CA, so provisioning it without trusting that CA reproduces the error a user meets."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from servicebus_local.clock import FakeClock
from spark_sb.admin import cli
from spark_sb.admin.provisioning import (
    provision_backlog_queues,
)
from spark_sb.config.service_bus import load_config
from spark_sb.core.errors import ProvisioningError

#: Variables through which requests / OpenSSL could already trust the local CA.
_TRUST_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture
def secondary() -> Iterator[object]:
    from servicebus_local.server import LocalNamespace

    ns = LocalNamespace("secondary").start()
    try:
        yield ns
    finally:
        ns.stop()


def _config(secondary: object) -> dict[str, object]:
    return {
        "primary": {
            "connection_string": "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=s;"
            "UseDevelopmentEmulator=true",
            "namespace_name": "primary",
        },
        "secondary": {"connection_string": secondary.connection_string},  # type: ignore[attr-defined]
        "backlog_queue_count": 2,
    }


def test_provisioning_a_local_namespace_without_its_ca_fails_with_the_hint_and_no_retry(
    secondary: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _TRUST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    clock = FakeClock()
    start = clock.monotonic()
    with pytest.raises(ProvisioningError) as caught:
        provision_backlog_queues(load_config(_config(secondary)), tries=3, retry_pause=30, clock=clock)
    text = str(caught.value)
    assert "CERTIFICATE_VERIFY_FAILED" in text
    assert "REQUESTS_CA_BUNDLE" in text and "ca_file" in text
    assert "(1 try)" in text
    assert clock.monotonic() == start  # no pause: a retry cannot fix trust

    # what the hint says works
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", secondary.ca_file)  # type: ignore[attr-defined]
    report = provision_backlog_queues(load_config(_config(secondary)), tries=1, clock=clock)
    assert report.ok and len(report.created) == 2


def test_the_cli_prints_the_hint(secondary: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in _TRUST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    import yaml

    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(_config(secondary)))
    args = argparse.Namespace(config=str(path), tries=None, retry_pause=None, dry_run=False, json=False)
    out, err = io.StringIO(), io.StringIO()
    assert cli.run_provision(args, out=out, err=err) == cli.EXIT_FAILED
    message = err.getvalue()
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert "export REQUESTS_CA_BUNDLE=<ca_file>" in message
