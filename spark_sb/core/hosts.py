"""A namespace's host as written: ``host[:port]``, an IPv6 literal in brackets, any case, a trailing slash or dot.
Pure; runs anywhere."""

from __future__ import annotations


def name_and_port(host: str) -> tuple[str, str]:
    """``host[:port]`` split into the lower-case name, without a trailing dot or slash, and the port as written
    (``""`` when none): ``Contoso.servicebus.windows.net.:5671/`` -> (``contoso.servicebus.windows.net``,
    ``5671``); ``[::1]:5672`` -> (``[::1]``, ``5672``)."""
    text = host.strip().rstrip("/").lower()
    name, port = text, ""
    if text.startswith("["):  # [v6]:port
        name, _, rest = text.partition("]")
        name, port = name + "]", rest.lstrip(":")
    elif text.count(":") == 1:
        name, port = text.split(":")
    return name.rstrip("."), port
