"""TLS material for the local namespace's HTTPS administration endpoint (SPEC E3).

The SDK's ``ServiceBusAdministrationClient`` always speaks HTTPS to the host:port of the connection string, so
the local namespace needs a server certificate for ``127.0.0.1`` that the user can trust, either with
``connection_verify=<ca.pem>`` or ``REQUESTS_CA_BUNDLE=<ca.pem>`` (protocol-notes.md).

One throw-away CA and one leaf certificate (subjectAltName ``IP:127.0.0.1``, ``DNS:localhost``) are generated
per process, on first use, and shared by every :class:`LocalTls`; starting many namespaces in a test run costs
one key generation in total. Nothing here is secret beyond this process: the keys are made up at start-up and
never leave memory except the CA *certificate* (public) written to ``ca.pem``.

Runs inside the local namespace process (tests, the demo, the CLI).
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LocalTls", "CA_FILE_NAME"]

#: File name of the CA certificate written into the directory given to :meth:`LocalTls.create`.
CA_FILE_NAME = "ca.pem"


@dataclass(frozen=True)
class _Material:
    """PEM bytes of the per-process CA certificate and of the server's certificate chain and private key."""

    ca_cert_pem: bytes
    server_chain_pem: bytes
    server_key_pem: bytes = field(repr=False)


_material: _Material | None = None
_material_lock = threading.Lock()


def _get_material() -> _Material:
    """The process-wide CA and server certificate, generated on first call (thread-safe)."""
    global _material
    with _material_lock:
        if _material is None:
            import trustme  # imported lazily: only the local namespace needs it

            ca = trustme.CA(organization_name="spark-servicebus local namespace")
            leaf = ca.issue_cert("127.0.0.1", "localhost", common_name="127.0.0.1")
            _material = _Material(
                ca_cert_pem=ca.cert_pem.bytes(),
                server_chain_pem=b"".join(blob.bytes() for blob in leaf.cert_chain_pems),
                server_key_pem=leaf.private_key_pem.bytes(),
            )
        return _material


def _server_context(material: _Material) -> ssl.SSLContext:
    """A fresh server-side context holding the shared certificate (contexts are cheap; material is not)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain only reads files: write chain and key to a private temporary file, then delete it.
    fd, path = tempfile.mkstemp(prefix="spark-sb-tls-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(material.server_chain_pem)
            handle.write(material.server_key_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)
    return context


@dataclass(frozen=True)
class LocalTls:
    """A CA file to trust and the matching server-side SSL context for ``127.0.0.1`` / ``localhost``.

    ``ca_file`` is the path of a PEM file holding only the CA certificate; pass it to the admin client as
    ``connection_verify=`` or through ``REQUESTS_CA_BUNDLE``. ``server_context`` is shared by every connection
    of one namespace (``ssl.SSLContext`` is thread-safe for wrapping sockets).
    """

    ca_file: str
    server_context: ssl.SSLContext = field(repr=False, compare=False)

    @classmethod
    def create(cls, directory: str | Path) -> LocalTls:
        """Write ``ca.pem`` into ``directory`` (created if missing) and build a server context.

        The certificate is generated once per process; later calls only write the file and load the context.
        """
        material = _get_material()
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        ca_path = target / CA_FILE_NAME
        ca_path.write_bytes(material.ca_cert_pem)
        return cls(ca_file=str(ca_path), server_context=_server_context(material))
