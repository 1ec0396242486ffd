"""The integration tier runs against strict local namespaces (issue 33, SPEC E8): a lock token is settled only on the
link that received the message, or over ``$management`` for a deferred message; anything else is refused with
``com.microsoft:message-lock-lost``. The service itself accepts a token settled over another receiver's
``$management`` for entities without sessions (servicebus_local/README.md, settlement), and the local namespace does
too by default; the product must not rely on it - the syphon settles on its receiving link - so its tests run strict
and fail if it ever does. Set before any namespace starts: every ``LocalNamespace`` of this tier's processes (and of
their children) reads it."""

from __future__ import annotations

import os

from servicebus_local.server import STRICT_SETTLEMENT_ENV

os.environ.setdefault(STRICT_SETTLEMENT_ENV, "1")
