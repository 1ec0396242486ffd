"""Shared access signature checks of the local namespace: one rule for the AMQP port (CBS put-token) and the
HTTPS admin endpoint (``Authorization`` header).

A token is ``SharedAccessSignature sr=<resource>&sig=<base64 HMAC-SHA256>&se=<expiry>&skn=<key name>`` (any
field order). The signature is accepted when it is the HMAC of ``<sr> + "\\n" + <se>`` with the key for any
of these spellings of ``sr``: exactly as it appears in the token (a hand-built token whose ``sr`` is the URI as
written, the form users of ``AzureSasCredential`` build from the documentation), its URL-encoded form
(``quote_plus``, what the SDK signs) and its decoded form. Expired tokens, wrong keys and unknown key names are
refused. The refusal never contains the key or the signature.

Pure functions; run in the namespace's server thread and admin threads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from enum import Enum
from urllib.parse import quote, quote_plus, unquote, unquote_plus

__all__ = ["Refusal", "check_sas"]

PREFIX = "SharedAccessSignature "


class Refusal(Enum):
    """Why a token is refused."""

    NOT_SAS = "not a SharedAccessSignature token"
    MALFORMED = "malformed SharedAccessSignature (sr, sig, se and skn are required)"
    KEY_NAME = "unknown shared access key name"
    EXPIRY = "malformed expiry"
    EXPIRED = "expired token"
    SIGNATURE_FORMAT = "malformed signature"
    SIGNATURE = "invalid signature"


def _raw_fields(text: str) -> dict[str, str]:
    """``k=v`` pairs split on ``&`` without decoding the values (``sr`` must be seen as sent)."""
    out: dict[str, str] = {}
    for pair in text.split("&"):
        key, sep, value = pair.partition("=")
        if sep:
            out.setdefault(key.strip(), value)
    return out


def check_sas(token: str | None, key_name: str, key: str, now: float) -> Refusal | None:
    """Why ``token`` is refused, or None if it is valid for ``key_name`` / ``key`` at ``now`` (epoch s)."""
    if token and token.startswith("Bearer "):
        token = token[len("Bearer ") :]  # the admin client sends a SAS token credential as a bearer token
    if not token or not token.startswith(PREFIX):
        return Refusal.NOT_SAS
    raw = _raw_fields(token[len(PREFIX) :])
    sr, sig, se, skn = raw.get("sr"), raw.get("sig"), raw.get("se"), raw.get("skn")
    if not sr or not sig or not se or skn is None:
        return Refusal.MALFORMED
    # The SDK quotes the key name (sometimes twice).
    names = {skn, unquote_plus(skn), unquote_plus(unquote_plus(skn))}
    if key_name not in names:
        return Refusal.KEY_NAME
    try:
        expiry = int(unquote_plus(se))
    except ValueError:
        return Refusal.EXPIRY
    if expiry <= now:
        return Refusal.EXPIRED
    given = None
    for spelling in dict.fromkeys((sig, unquote(sig), unquote_plus(sig))):  # encoded or as written
        try:
            given = base64.b64decode(spelling, validate=True)
            break
        except (binascii.Error, ValueError):
            continue
    if given is None:
        return Refusal.SIGNATURE_FORMAT
    decoded = unquote_plus(sr)
    for resource in dict.fromkeys((sr, quote_plus(decoded), decoded, quote(decoded, safe=""))):
        expected = hmac.new(key.encode("utf-8"), f"{resource}\n{expiry}".encode(), hashlib.sha256).digest()
        if hmac.compare_digest(expected, given):
            return None
    return Refusal.SIGNATURE
