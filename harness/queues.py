"""Reading and filling a namespace's queues from outside, with the plain SDK: the one place the tests, the harness
and the benches take messages out of an entity (receive-and-delete) and put a batch of them in.

* :func:`take` / :func:`take_ids` - receive and delete the messages of a queue (its ``sub_queue``, or a topic's
  ``subscription``; one session's with ``session_id``): with ``expected``, until that many came; without, until
  a receive comes back empty (``empty`` of them in a row) - either way within ``deadline`` seconds.
* :func:`put` - send SDK messages to a queue in size-bounded batches.

Test and bench code (driver machine); every receive waits at most ``wait`` seconds, the whole at most ``deadline``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessageSizeExceededError


def take(
    connection_string: str,
    entity: str,
    *,
    expected: int | None = None,
    sub_queue: Any = None,
    subscription: str | None = None,
    session_id: str | None = None,
    wait: float = 0.5,
    batch: int = 500,
    empty: int = 1,
    deadline: float = 30.0,
    prefetch: int = 0,
    verify: str | None = None,
) -> list[Any]:
    """The messages of ``entity``, received and deleted (see the module docstring); ``verify``: the CA file of a
    namespace with a development certificate (the local namespaces' own TLS)."""
    out: list[Any] = []
    if expected is not None and expected <= 0:
        return out
    kwargs: dict[str, Any] = {"connection_verify": verify} if verify else {}
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
    until = time.monotonic() + deadline
    with ServiceBusClient.from_connection_string(connection_string, **kwargs) as client:
        receiver = (
            client.get_subscription_receiver(
                entity, subscription, session_id=session_id, receive_mode=mode, prefetch_count=prefetch
            )
            if subscription
            else client.get_queue_receiver(
                entity, session_id=session_id, sub_queue=sub_queue, receive_mode=mode, prefetch_count=prefetch
            )
        )
        with receiver:
            empties = 0
            while time.monotonic() < until:
                want = batch if expected is None else min(batch, expected - len(out))
                got = receiver.receive_messages(max_message_count=want, max_wait_time=wait)
                out.extend(got)
                if expected is not None:
                    if len(out) >= expected:
                        break
                    continue
                empties = 0 if got else empties + 1
                if empties >= empty:
                    break
    return out


def take_ids(connection_string: str, entity: str, **options: Any) -> list[str]:
    """The message ids of :func:`take`, in the order received."""
    return [str(m.message_id) for m in take(connection_string, entity, **options)]


def put(connection_string: str, queue: str, messages: Iterable[ServiceBusMessage]) -> int:
    """Send ``messages`` to ``queue`` in as few batches as fit; how many were sent."""
    n = 0
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        batch = sender.create_message_batch()
        for msg in messages:
            try:
                batch.add_message(msg)
            except MessageSizeExceededError:  # full: send it
                sender.send_messages(batch)
                batch = sender.create_message_batch()
                batch.add_message(msg)
            n += 1
        if len(batch):
            sender.send_messages(batch)
    return n
