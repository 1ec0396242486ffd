"""What real client code expects of the local namespace, driven through the unmodified SDK over real TCP:
session ids on entities without sessions, session dead-letter queues, annotated messages, hand-built SAS tokens,
closing with an error, operation counters, and the CLI's user errors."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import ClientAuthenticationError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.amqp import (
    AmqpAnnotatedMessage,
    AmqpMessageBodyType,
    AmqpMessageHeader,
    AmqpMessageProperties,
)
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusConnectionError
from azure.servicebus.management import ServiceBusAdministrationClient

from servicebus_local.model import QueueSettings, SubscriptionSettings
from servicebus_local.sas import Refusal, check_sas
from servicebus_local.server import LocalNamespace

from .conftest import run_cli

KEY = "bG9jYWwtZmlkZWxpdHkta2V5"


def _receive(receiver: Any, expected: int, timeout: float = 5.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected and time.monotonic() < deadline:
        out += receiver.receive_messages(max_message_count=expected - len(out), max_wait_time=1)
    return out


# ------------------------------------------------------------------------------------------------------------
# sessions
def test_session_id_on_entities_without_sessions_reaches_plain_receivers() -> None:
    with LocalNamespace("sess-plain", queues=["q"], topics={"t": ["s"]}) as ns:
        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_queue_sender("q") as sender:
                sender.send_messages([ServiceBusMessage("a", session_id="s1"), ServiceBusMessage("b")])
            with sb.get_topic_sender("t") as sender:
                sender.send_messages(ServiceBusMessage("c", session_id="s2"))
            with sb.get_queue_receiver("q") as receiver:
                got = _receive(receiver, 2)
                assert sorted(str(m) for m in got) == ["a", "b"]
                assert {m.session_id for m in got} == {"s1", None}
                for m in got:
                    receiver.complete_message(m)
            with sb.get_subscription_receiver("t", "s") as receiver:
                (msg,) = _receive(receiver, 1)
                assert str(msg) == "c" and msg.session_id == "s2"
                receiver.complete_message(msg)
        assert ns.broker.get_queue("q").runtime.active_message_count == 0


def test_dead_letters_of_session_entities_are_receivable_from_the_dead_letter_queue() -> None:
    with LocalNamespace("sess-dlq") as ns:
        ns.broker.create_queue("sq", QueueSettings(requires_session=True))
        ns.broker.create_topic("t")
        ns.broker.create_subscription("t", "ss", SubscriptionSettings(requires_session=True))
        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_queue_sender("sq") as sender:
                sender.send_messages(
                    [ServiceBusMessage("x", session_id="A"), ServiceBusMessage("y", session_id="B")]
                )
            with sb.get_topic_sender("t") as sender:
                sender.send_messages(ServiceBusMessage("z", session_id="C"))
            for session in ("A", "B"):
                with sb.get_queue_receiver("sq", session_id=session) as receiver:
                    (msg,) = _receive(receiver, 1)
                    receiver.dead_letter_message(msg, reason="bad", error_description=f"session {session}")
            with sb.get_subscription_receiver("t", "ss", session_id="C") as receiver:
                (msg,) = _receive(receiver, 1)
                receiver.dead_letter_message(msg, reason="worse")
            with sb.get_queue_receiver("sq", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                got = _receive(receiver, 2)
                assert sorted((str(m), m.session_id, m.dead_letter_reason) for m in got) == [
                    ("x", "A", "bad"),
                    ("y", "B", "bad"),
                ]
                for m in got:
                    receiver.complete_message(m)
            with sb.get_subscription_receiver(
                "t", "ss", sub_queue=ServiceBusSubQueue.DEAD_LETTER
            ) as receiver:
                (msg,) = _receive(receiver, 1)
                assert (str(msg), msg.session_id, msg.dead_letter_reason) == ("z", "C", "worse")
                receiver.complete_message(msg)
        assert ns.broker.get_queue("sq").runtime.dead_letter_message_count == 0


# ------------------------------------------------------------------------------------------------------------
# annotated messages


def _annotated() -> list[AmqpAnnotatedMessage]:
    return [
        AmqpAnnotatedMessage(
            data_body=[b"one", b"two"],
            header=AmqpMessageHeader(priority=7, durable=True, time_to_live=60_000),
            delivery_annotations={"trace": "t-1"},
            annotations={"custom": "annotation"},
            properties=AmqpMessageProperties(
                message_id="id-1",
                subject="subject",
                content_type="text/plain",
                correlation_id="corr",
                to="to",
                reply_to="reply",
                user_id=b"user",
            ),
            application_properties={"k": "v", "n": 5},
            footer={"f": "foot"},
        ),
        AmqpAnnotatedMessage(value_body={"a": [1, 2]}, application_properties={"kind": "value"}),
        AmqpAnnotatedMessage(sequence_body=[[1, "a"], [2, "b"]]),
    ]


def _check_annotated(got: list[Any]) -> None:
    by_kind = {m.raw_amqp_message.body_type: m.raw_amqp_message for m in got}
    data = by_kind[AmqpMessageBodyType.DATA]
    assert list(data.body) == [b"one", b"two"]
    assert (data.header.priority, data.header.durable, data.header.time_to_live) == (7, True, 60_000)
    assert data.delivery_annotations == {b"trace": b"t-1"}
    assert data.annotations[b"custom"] == b"annotation"
    props = data.properties
    assert (props.message_id, props.subject, props.content_type) == (b"id-1", b"subject", b"text/plain")
    assert (props.correlation_id, props.to, props.reply_to, props.user_id) == (
        b"corr",
        b"to",
        b"reply",
        b"user",
    )
    assert data.application_properties == {b"k": b"v", b"n": 5}
    assert data.footer == {b"f": b"foot"}
    value = by_kind[AmqpMessageBodyType.VALUE]
    assert value.body == {b"a": [1, 2]} and value.application_properties == {b"kind": b"value"}
    assert list(by_kind[AmqpMessageBodyType.SEQUENCE].body) == [[1, b"a"], [2, b"b"]]


def test_annotated_messages_round_trip_sync() -> None:
    with (
        LocalNamespace("annotated", queues=["q"]) as ns,
        ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as sb,
    ):
        with sb.get_queue_sender("q") as sender:
            for message in _annotated():  # one by one, and as one batch
                sender.send_messages(message)
            sender.send_messages(_annotated())
        with sb.get_queue_receiver("q") as receiver:
            got = _receive(receiver, 6)
            assert len(got) == 6
            _check_annotated(got[:3])
            _check_annotated(got[3:])
            for m in got:
                receiver.complete_message(m)


def test_annotated_messages_round_trip_async() -> None:
    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    async def scenario(ns: LocalNamespace) -> None:
        async with AsyncClient.from_connection_string(ns.connection_string, retry_total=0) as sb:
            async with sb.get_queue_sender("q") as sender:
                await sender.send_messages(_annotated())
            async with sb.get_queue_receiver("q") as receiver:
                got: list[Any] = []
                deadline = time.monotonic() + 5
                while len(got) < 3 and time.monotonic() < deadline:
                    got += await receiver.receive_messages(max_message_count=3, max_wait_time=1)
                _check_annotated(got)
                for m in got:
                    await receiver.complete_message(m)

    with LocalNamespace("annotated-async", queues=["q"]) as ns:
        asyncio.run(scenario(ns))


# ------------------------------------------------------------------------------------------------------------
# SAS tokens


def _hand_built(uri: str, key_name: str, key: str, expiry: int) -> str:
    """A token as the documentation shows it built by hand: ``sr`` as written, signed over that string."""
    digest = hmac.new(key.encode(), f"{uri}\n{expiry}".encode(), hashlib.sha256).digest()
    return f"SharedAccessSignature sr={uri}&sig={quote_plus(base64.b64encode(digest).decode())}&se={expiry}&skn={key_name}"


def _sdk_form(uri: str, key_name: str, key: str, expiry: int) -> str:
    from azure.servicebus._pyamqp.utils import generate_sas_token

    return generate_sas_token(uri, key_name, key, expiry)  # type: ignore[no-any-return]


def test_check_sas_table() -> None:
    uri, now, exp = "sb://127.0.0.1:5672/q", 1_000_000.0, 1_000_060
    assert check_sas(_hand_built(uri, "Root", KEY, exp), "Root", KEY, now) is None
    assert check_sas(_sdk_form(uri, "Root", KEY, exp), "Root", KEY, now) is None
    assert check_sas("Bearer " + _hand_built(uri, "Root", KEY, exp), "Root", KEY, now) is None
    assert check_sas(_hand_built(uri, "Root", "other", exp), "Root", KEY, now) is Refusal.SIGNATURE
    assert check_sas(_hand_built(uri, "Other", KEY, exp), "Root", KEY, now) is Refusal.KEY_NAME
    assert check_sas(_hand_built(uri, "Root", KEY, 999_999), "Root", KEY, now) is Refusal.EXPIRED
    assert check_sas(_sdk_form(uri, "Root", KEY, 999_999), "Root", KEY, now) is Refusal.EXPIRED
    assert check_sas("SharedAccessSignature sr=x&se=1", "Root", KEY, now) is Refusal.MALFORMED
    assert check_sas("token", "Root", KEY, now) is Refusal.NOT_SAS
    # a signature over another resource string does not pass
    forged = _hand_built(uri, "Root", KEY, exp).replace(f"sr={uri}", "sr=sb://127.0.0.1:5672/other")
    assert check_sas(forged, "Root", KEY, now) is Refusal.SIGNATURE


def test_hand_built_sas_tokens_on_the_amqp_port_and_the_admin_endpoint() -> None:
    with LocalNamespace("sas", queues=["q"], key=KEY) as ns:
        host = f"127.0.0.1:{ns.port}"
        later = int(time.time()) + 3600

        def send_with(token: str) -> None:
            with (
                ServiceBusClient(host, AzureSasCredential(token), use_tls=False, retry_total=0) as sb,
                sb.get_queue_sender("q") as sender,
            ):
                sender.send_messages(ServiceBusMessage("signed"))

        send_with(_hand_built(f"sb://{host}/q", ns.key_name, KEY, later))  # sr not URL-encoded
        send_with(_hand_built(f"sb://{host}/", ns.key_name, KEY, later))
        send_with(_sdk_form(f"sb://{host}/q", ns.key_name, KEY, later))
        conn = f"Endpoint=sb://{host};SharedAccessSignature={_hand_built(f'sb://{host}/q', ns.key_name, KEY, later)};UseDevelopmentEmulator=true"
        with (
            ServiceBusClient.from_connection_string(conn, retry_total=0) as sb,
            sb.get_queue_sender("q") as sender,
        ):
            sender.send_messages(ServiceBusMessage("signed"))
        assert ns.broker.get_queue("q").runtime.active_message_count == 4
        for bad in (
            _hand_built(f"sb://{host}/q", ns.key_name, "wrong-key", later),
            _hand_built(f"sb://{host}/q", "unknown-name", KEY, later),
            _hand_built(f"sb://{host}/q", ns.key_name, KEY, int(time.time()) - 10),
        ):
            with pytest.raises(ServiceBusAuthenticationError):
                send_with(bad)
        assert ns.broker.get_queue("q").runtime.active_message_count == 4

        def admin_with(token: str) -> ServiceBusAdministrationClient:
            return ServiceBusAdministrationClient.from_connection_string(
                f"Endpoint=sb://{host};SharedAccessSignature={token}",
                connection_verify=ns.ca_file,
                retry_total=0,
            )

        with admin_with(_hand_built(f"https://{host}/", ns.key_name, KEY, later)) as admin:
            assert admin.get_queue_runtime_properties("q").active_message_count == 4
        with admin_with(_hand_built(f"https://{host}/q", ns.key_name, KEY, later)) as admin:
            assert admin.get_queue("q").name == "q"
        for bad in (
            _hand_built(f"https://{host}/", ns.key_name, "wrong-key", later),
            _hand_built(f"https://{host}/", "unknown-name", KEY, later),
        ):
            with admin_with(bad) as admin, pytest.raises(ClientAuthenticationError):
                admin.get_queue("q")


# ------------------------------------------------------------------------------------------------------------
# closing with an error
def test_connection_closed_with_an_error_raises_the_sdks_connection_error() -> None:
    with (
        LocalNamespace("closing", queues=["q"]) as ns,
        ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as sb,
        sb.get_queue_receiver("q") as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=0.2)
        ns.faults.close_connections("amqp:connection:forced", "maintenance window")
        with pytest.raises(ServiceBusConnectionError) as caught:
            for _ in range(3):  # the close frame may arrive during the next call
                receiver.receive_messages(max_message_count=1, max_wait_time=1)
        assert "maintenance window" in str(caught.value)
        assert "amqp:connection:forced" in str(caught.value)


def test_link_refused_with_an_error_names_it() -> None:
    """A detach with an error carries its description and info map: the SDK raises its own class."""
    from azure.servicebus.exceptions import ServiceBusError

    with (
        LocalNamespace("detach", queues=["q"]) as ns,
        ServiceBusClient.from_connection_string(ns.connection_string, retry_total=0) as sb,
    ):
        with pytest.raises(ServiceBusError) as caught, sb.get_queue_sender("missing") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        assert "could not be found" in str(caught.value)
        assert not isinstance(caught.value.__cause__, IndexError)


# ------------------------------------------------------------------------------------------------------------
# operation counters
def test_operation_counters_in_process_and_in_the_control_api() -> None:
    with LocalNamespace("counted", queues=["q"], control_port=0) as ns:
        assert ns.counters()["connections_opened"] == 0
        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_queue_sender("q") as sender:
                sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
                sender.send_messages(ServiceBusMessage("c"))
                sender.schedule_messages(ServiceBusMessage("d"), time.time() + 3600)  # type: ignore[arg-type]
            with sb.get_queue_receiver("q", prefetch_count=0) as receiver:
                before = ns.counters()["receive_flows"]
                got = _receive(receiver, 3)
                for m in got:
                    receiver.complete_message(m)
                flows = ns.counters()["receive_flows"] - before
            with ns.admin_client() as admin:
                admin.get_queue("q")
        counters = ns.counters()
        assert counters["connections_opened"] >= 2
        assert counters["transfers_received"] == 2 and counters["messages_received"] == 3
        assert counters["sender_links_opened"] == 1 and counters["receiver_links_opened"] == 1
        assert counters["messages_delivered"] == 3 and counters["settlements"] == 3
        assert flows >= 1 and counters["receive_flows"] >= flows
        assert counters["management_operations"] >= 1 and counters["management:schedule-message"] == 1
        assert counters["admin_requests"] >= 1 and counters["admin_connections_opened"] >= 1
        with urllib.request.urlopen(f"{ns.control_url}/status", timeout=5) as reply:
            status = json.loads(reply.read())
        assert status["counters"]["messages_received"] == 3
        assert status["counters"]["receive_flows"] == ns.counters()["receive_flows"]
        request = urllib.request.Request(f"{ns.control_url}/counters/reset", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=5):
            pass
        assert ns.counters()["messages_received"] == 0


def test_an_idle_receiver_between_calls_costs_no_receive_flows() -> None:
    with (
        LocalNamespace("idle", queues=["q"]) as ns,
        ServiceBusClient.from_connection_string(ns.connection_string) as sb,
        sb.get_queue_receiver("q", prefetch_count=0) as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=0.5)
        after_call = ns.counters()["receive_flows"]
        assert after_call >= 1
        with sb.get_queue_sender("q") as sender:  # other traffic is not a receive call
            sender.send_messages(ServiceBusMessage("x"))
        assert ns.counters()["receive_flows"] == after_call
        # the credit left by the first call takes the message; once used, the next call grants more
        (msg,) = _receive(receiver, 1)
        receiver.complete_message(msg)
        before_next = ns.counters()["receive_flows"]
        receiver.receive_messages(max_message_count=1, max_wait_time=0.5)
        assert ns.counters()["receive_flows"] > before_next


# ------------------------------------------------------------------------------------------------------------
# python -m servicebus_local: user errors


def test_cli_user_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("queues: [\n")
    bad_key = tmp_path / "bad-key.yaml"
    bad_key.write_text("queues:\n  - name: a\n    lock_durration: 30s\n")
    bad_rule = tmp_path / "bad-rule.yaml"
    bad_rule.write_text(
        "topics:\n  - name: t\n    subscriptions:\n      - name: s\n        rules:\n          - {name: r, filter: 'a =='}\n"
    )
    cases = [
        ((str(tmp_path / "missing.yaml")), "topology file not found"),
        ((str(bad_yaml)), "not valid YAML"),
        ((str(bad_key)), "unknown setting 'lock_durration'"),
        ((str(bad_rule)), "column"),
        ((str(tmp_path)), "directory"),
    ]
    for path, text in cases:
        result = run_cli("--topology", path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and text in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "servicebus_local", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"port {port}" in result.stderr and "in use" in result.stderr
    assert "Traceback" not in result.stderr


def _frames(data: bytes) -> list[Any]:
    """Decoded AMQP performatives in a byte stream (protocol headers skipped)."""
    from servicebus_local.amqp import decode_value

    out: list[Any] = []
    pos = 0
    while pos + 8 <= len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size, doff = int.from_bytes(data[pos : pos + 4], "big"), data[pos + 4]
        if size > doff * 4:
            out.append(decode_value(data, pos + doff * 4)[0])
        pos += size
    return out


def test_a_protocol_error_close_carries_description_and_info_map() -> None:
    """Proton closes the connection itself on a framing error: that close carries an info map too."""
    with LocalNamespace("framing") as ns, socket.create_connection(("127.0.0.1", ns.port), timeout=5) as raw:
        raw.sendall(b"AMQP\x03\x01\x00\x00")
        sasl_init = b"\x00\x53\x41\xc0\x0c\x01\xa3\x09ANONYMOUS"
        raw.sendall((8 + len(sasl_init)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + sasl_init)
        sasl = b""
        while b"\x00\x53\x44" not in sasl:  # wait for the SASL outcome
            sasl += raw.recv(4096)
        raw.sendall(
            b"AMQP\x00\x01\x00\x00" + (4).to_bytes(4, "big") + b"\x02\x00\x00\x00"
        )  # a frame of size 4
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
        assert b"AMQP\x00\x01\x00\x00" in received, received
        amqp_part = received[received.index(b"AMQP\x00\x01\x00\x00") :]
        closes = [f for f in _frames(amqp_part) if getattr(f, "descriptor", None) == 0x18]
        assert len(closes) == 1
        error = closes[0].value[0]
        condition, description, info = error.value
        assert condition == "amqp:connection:framing-error" and description
        assert isinstance(info, dict) and info


def test_async_client_hand_built_sas_and_error_close() -> None:
    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    async def scenario(ns: LocalNamespace) -> None:
        host = f"127.0.0.1:{ns.port}"
        token = _hand_built(f"sb://{host}/q", ns.key_name, KEY, int(time.time()) + 3600)
        async with AsyncClient(host, AzureSasCredential(token), use_tls=False, retry_total=0) as sb:
            async with sb.get_queue_sender("q") as sender:
                await sender.send_messages(ServiceBusMessage("async"))
            async with sb.get_queue_receiver("q") as receiver:
                (msg,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                await receiver.complete_message(msg)
                ns.faults.close_connections("amqp:connection:forced", "async maintenance")
                with pytest.raises(ServiceBusConnectionError) as caught:
                    for _ in range(3):
                        await receiver.receive_messages(max_message_count=1, max_wait_time=1)
                assert "async maintenance" in str(caught.value)
        wrong = _hand_built(f"sb://{host}/q", ns.key_name, "wrong-key", int(time.time()) + 3600)
        async with AsyncClient(host, AzureSasCredential(wrong), use_tls=False, retry_total=0) as sb:
            with pytest.raises(ServiceBusAuthenticationError):
                async with sb.get_queue_sender("q") as sender:
                    await sender.send_messages(ServiceBusMessage("refused"))

    with LocalNamespace("sas-async", queues=["q"], key=KEY) as ns:
        asyncio.run(scenario(ns))
