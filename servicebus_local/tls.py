"""TLS material for the local namespace's HTTPS administration endpoint (SPEC E3).

The SDK's ``ServiceBusAdministrationClient`` always speaks HTTPS to the host:port of the connection string, so
the local namespace needs a server certificate for ``127.0.0.1`` that the user can trust, either with
``connection_verify=<ca.pem>`` or ``REQUESTS_CA_BUNDLE=<ca.pem>`` (protocol-notes.md).

One throw-away CA and one leaf certificate (subjectAltName ``IP:127.0.0.1``, ``DNS:localhost``) are generated
per process, on first use, and shared by every :class:`LocalTls`; starting many namespaces in a test run costs
one key generation in total. By default nothing leaves memory except the CA *certificate* (public) written to
``ca.pem``.

With ``SPARK_SB_LOCAL_TLS_DIR=<dir>`` (the CLI's ``--tls-dir``) the material is kept in ``<dir>`` instead and
reused by every process that points there, so several namespaces started as separate processes share one CA and
one ``REQUESTS_CA_BUNDLE=<dir>/ca.pem`` trusts them all; that file is every namespace's ``ca_file`` then (what
the CLI prints), and it stays when they stop. The directory then holds the local CA's private key
(mode 0600): it is a development CA for 127.0.0.1 only, like mkcert's.

Runs inside the local namespace process (tests, the demo, the CLI).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CA_FILE_NAME", "TLS_DIR_ENV", "LocalTls"]

#: File name of the CA certificate written into the directory given to :meth:`LocalTls.create`.
CA_FILE_NAME = "ca.pem"


@dataclass(frozen=True)
class _Material:
    """PEM bytes of the per-process CA certificate and of the server's certificate chain and private key."""

    ca_cert_pem: bytes
    server_chain_pem: bytes
    server_key_pem: bytes = field(repr=False)


_material: _Material | None = None
_material_dir: Path | None = None  # where it is kept and shared ($SPARK_SB_LOCAL_TLS_DIR), if anywhere
_material_lock = threading.Lock()

#: Environment variable naming a directory where the CA and server material is kept and shared by processes.
TLS_DIR_ENV = "SPARK_SB_LOCAL_TLS_DIR"
_SHARED_FILE = "local-namespace-tls.pem"  # CA cert, server chain, server key: PEM blocks, in that order


def _generate() -> _Material:
    import trustme  # imported lazily: only the local namespace needs it

    ca = trustme.CA(organization_name="spark-servicebus local namespace")
    leaf = ca.issue_cert("127.0.0.1", "localhost", common_name="127.0.0.1")
    return _Material(
        ca_cert_pem=ca.cert_pem.bytes(),
        server_chain_pem=b"".join(blob.bytes() for blob in leaf.cert_chain_pems),
        server_key_pem=leaf.private_key_pem.bytes(),
    )


def _pem_blocks(data: bytes) -> list[bytes]:
    marker = b"-----END "
    blocks, rest = [], data
    while marker in rest:
        head, _, tail = rest.partition(marker)
        line_end = tail.find(b"\n")
        end = len(tail) if line_end < 0 else line_end + 1
        blocks.append((head + marker + tail[:end]).strip() + b"\n")
        rest = tail[end:]
    return blocks


def _shared_material(directory: Path) -> _Material:
    """Load the material kept in ``directory``, or create it there atomically (first process wins)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / _SHARED_FILE
    if not final.exists():
        material = _generate()
        fd, tmp = tempfile.mkstemp(prefix=".tls-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:  # mkstemp files are 0600
                handle.write(material.ca_cert_pem + material.server_chain_pem + material.server_key_pem)
            with contextlib.suppress(FileExistsError):  # another process got there first: use theirs
                os.link(tmp, final)
        finally:
            os.unlink(tmp)
    blocks = _pem_blocks(final.read_bytes())
    keys = [b for b in blocks if b"PRIVATE KEY" in b.splitlines()[0]]
    certs = [b for b in blocks if b"CERTIFICATE" in b.splitlines()[0]]
    if len(keys) != 1 or len(certs) < 2:
        raise ValueError(f"{final} is not a local namespace TLS bundle; delete it to have it made again")
    material = _Material(ca_cert_pem=certs[0], server_chain_pem=b"".join(certs[1:]), server_key_pem=keys[0])
    _write_atomically(directory / CA_FILE_NAME, material.ca_cert_pem)
    return material


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: another process reading it (REQUESTS_CA_BUNDLE) never sees half."""
    fd, tmp = tempfile.mkstemp(prefix=".ca-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # the CA certificate is public
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _get_material() -> tuple[_Material, Path | None]:
    """The process-wide CA and server certificate, made (or loaded from ``$SPARK_SB_LOCAL_TLS_DIR``) on first
    call (thread-safe), and the directory where they are shared (``None``: this process's own)."""
    global _material, _material_dir
    with _material_lock:
        if _material is None:
            shared = os.environ.get(TLS_DIR_ENV)
            if shared:
                _material_dir = Path(shared).expanduser().absolute()
                _material = _shared_material(_material_dir)
            else:
                _material = _generate()
        return _material, _material_dir


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
        With ``$SPARK_SB_LOCAL_TLS_DIR`` set the CA file is the shared one, ``<that dir>/ca.pem``, which every
        process pointing there shares and which outlives them (``directory`` is then left alone).
        """
        material, shared = _get_material()
        if shared is not None:
            return cls(ca_file=str(shared / CA_FILE_NAME), server_context=_server_context(material))
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        ca_path = target / CA_FILE_NAME
        ca_path.write_bytes(material.ca_cert_pem)
        return cls(ca_file=str(ca_path), server_context=_server_context(material))
