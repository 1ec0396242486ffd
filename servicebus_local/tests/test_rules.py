"""Subscription rules: the SQL filter/action language as a table, and routing and rule CRUD through the unmodified
SDK (sync and async administration clients) against the local namespace over real TCP."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

from servicebus_local.rules import (
    CorrelationFilter,
    FilterEvaluationError,
    MessageView,
    Rule,
    SqlAction,
    SqlFilter,
    SqlSyntaxError,
    TrueFilter,
    route,
)
from servicebus_local.server import LocalNamespace
from servicebus_local.topology import TopologyError, parse_topology

VIEW = MessageView(
    system={
        "MessageId": "m-1",
        "CorrelationId": "corr",
        "Label": "order",
        "To": "shop",
        "ReplyTo": "replies",
        "SessionId": "s1",
        "ContentType": "application/json",
        "SequenceNumber": 7,
        "EnqueuedTimeUtc": datetime(2026, 1, 1, tzinfo=timezone.utc),
    },
    user={"amount": 150, "price": 2.5, "region": "eu-west", "vip": True, "code": "50%_off", "empty": None},
)

FILTER_TABLE: list[tuple[str, dict[str, Any], bool]] = [
    ("amount = 150", {}, True),
    ("amount <> 150", {}, False),
    ("amount != 150", {}, False),
    ("amount > 100 AND amount <= 150", {}, True),
    ("amount < 100 OR region = 'eu-west'", {}, True),
    ("NOT amount < 100", {}, True),
    ("price * 2 = 5", {}, True),
    ("(amount + 50) / 2 = 100", {}, True),
    ("amount % 7 = 3", {}, True),
    ("-amount = -150", {}, True),
    ("amount / 4 = 37", {}, True),  # integer division truncates
    ("price >= 2.5 AND price < 2.6e0", {}, True),
    ("region IN ('eu-west', 'us-east')", {}, True),
    ("region NOT IN ('eu-west', 'us-east')", {}, False),
    ("region LIKE 'eu-%'", {}, True),
    ("region LIKE 'e_-west'", {}, True),
    ("region NOT LIKE 'us%'", {}, True),
    ("code LIKE '50!%!_off' ESCAPE '!'", {}, True),
    ("code LIKE '50!%x' ESCAPE '!'", {}, False),
    ("missing IS NULL", {}, True),
    ("empty IS NULL", {}, True),
    ("region IS NOT NULL", {}, True),
    ("EXISTS(empty)", {}, True),
    ("EXISTS(missing)", {}, False),
    ("NOT EXISTS(missing)", {}, True),
    ("missing = 1", {}, False),  # unknown
    ("NOT missing = 1", {}, False),  # NOT unknown is unknown
    ("missing = 1 OR amount = 150", {}, True),
    ("region = 5", {}, False),  # across types: unknown
    ("vip = TRUE", {}, True),
    ("user.region = 'eu-west'", {}, True),
    ("[region] = 'eu-west'", {}, True),
    ("sys.Label = 'order' AND sys.MessageId = 'm-1'", {}, True),
    ("sys.label = 'order'", {}, True),  # system property names are case-insensitive
    ("sys.CorrelationId = 'corr' AND sys.To = 'shop' AND sys.ReplyTo = 'replies'", {}, True),
    ("sys.SessionId = 's1' AND sys.ContentType = 'application/json'", {}, True),
    ("sys.SequenceNumber > 5", {}, True),
    ("amount > @min AND region = @region", {"@min": 100, "@region": "eu-west"}, True),
    ("amount > @min", {"@min": 200}, False),
    ("'it''s' = 'it''s'", {}, True),
    ("1=1", {}, True),
    ("1>1", {}, False),
    ("TRUE", {}, True),
    ("FALSE OR (amount = 150 AND (region LIKE '%west'))", {}, True),
]


@pytest.mark.parametrize(("expression", "parameters", "expected"), FILTER_TABLE)
def test_sql_filter_table(expression: str, parameters: dict[str, Any], expected: bool) -> None:
    assert SqlFilter(expression, parameters).matches(VIEW) is expected


SYNTAX_ERRORS: list[tuple[str, int]] = [
    ("amount == 1", 8),
    ("amount =", 8),
    ("amount = 1 AND", 14),
    ("(amount = 1", 11),
    ("region = 'open", 9),
    ("region IN 'a'", 10),
    ("sys.Nope = 1", 4),
    ("amount 5", 7),
    ("amount = 1 garbage", 11),
    ("amount = #", 9),
    ("", 0),
]


@pytest.mark.parametrize(("expression", "position"), SYNTAX_ERRORS)
def test_sql_filter_syntax_errors_name_the_position(expression: str, position: int) -> None:
    with pytest.raises(SqlSyntaxError) as caught:
        SqlFilter(expression)
    assert caught.value.position == position
    assert f"column {position + 1}" in str(caught.value)


def test_sql_action_set_and_remove_on_a_copy() -> None:
    action = SqlAction(
        "SET total = amount * price; SET sys.Label = 'big'; REMOVE region; SET tag = @t", {"@t": "x"}
    )
    out = action.apply(VIEW)
    assert out.user["total"] == 375.0 and out.user["tag"] == "x" and "region" not in out.user
    assert out.system["Label"] == "big"
    assert VIEW.user["region"] == "eu-west" and VIEW.system["Label"] == "order"  # the original is untouched
    for bad in ("SET = 1", "REMOVE", "DELETE x", "SET x 1"):
        with pytest.raises(SqlSyntaxError):
            SqlAction(bad)


def test_correlation_filter_and_routing_semantics() -> None:
    assert CorrelationFilter(correlation_id="corr", label="order", properties={"amount": 150}).matches(VIEW)
    assert not CorrelationFilter(correlation_id="corr", properties={"amount": 151}).matches(VIEW)
    assert not CorrelationFilter(to="elsewhere").matches(VIEW)
    assert not CorrelationFilter(properties={"missing": None}).matches(VIEW)
    rules = {
        "a": Rule("a", SqlFilter("amount > 100")),
        "b": Rule("b", TrueFilter()),
        "c": Rule("c", SqlFilter("region LIKE 'eu%'"), SqlAction("SET routed = 'c'")),
        "d": Rule("d", SqlFilter("amount < 0"), SqlAction("SET routed = 'd'")),
    }
    copies = route(rules, VIEW)
    # the matching rules without action give one copy; each matching rule with an action gives its own
    assert len(copies) == 2 and copies[0] is VIEW and copies[1].user["routed"] == "c"
    assert copies[1].user["RuleName"] == "c" and "RuleName" not in VIEW.user
    assert route({"x": Rule("x", SqlFilter("amount < 0"))}, VIEW) == []
    with pytest.raises(FilterEvaluationError):
        route({"z": Rule("z", SqlFilter("amount / 0 = 1"))}, VIEW)


# ------------------------------------------------------------------------------------------------------------
# through the SDK


def _receive_all(sb: ServiceBusClient, topic: str, subscription: str, expected: int) -> list[Any]:
    out: list[Any] = []
    with sb.get_subscription_receiver(topic, subscription, max_wait_time=1) as receiver:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = receiver.receive_messages(max_message_count=50, max_wait_time=0.5)
            for m in got:
                receiver.complete_message(m)
            out += got
            if len(out) >= expected and not got:
                break
    return out


def test_routing_by_sql_and_correlation_filters_with_actions() -> None:
    subs = ["big", "eu", "corr", "none", "all", "twice"]
    with LocalNamespace("rules", topics={"orders": subs}) as ns, ns.admin_client() as admin:
        for sub in subs:
            if sub != "all":
                admin.delete_rule("orders", sub, "$Default")
        admin.create_rule(
            "orders",
            "big",
            "big-orders",
            filter=SqlRuleFilter("amount > @min AND sys.Label = 'order'", parameters={"@min": 100}),
            action=SqlRuleAction("SET priority = 'high'; SET sys.Label = 'big-order'; REMOVE internal"),
        )
        admin.create_rule("orders", "eu", "eu", filter=SqlRuleFilter("region LIKE 'eu-%' OR region IS NULL"))
        admin.create_rule(
            "orders",
            "corr",
            "by-corr",
            filter=CorrelationRuleFilter(correlation_id="c-42", properties={"region": "us-east"}),
        )
        admin.create_rule("orders", "none", "never", filter=FalseRuleFilter())
        # two plain rules that both match: one copy
        admin.create_rule("orders", "twice", "one", filter=SqlRuleFilter("amount > 0"))
        admin.create_rule("orders", "twice", "two", filter=TrueRuleFilter())

        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_topic_sender("orders") as sender:
                sender.send_messages(
                    [
                        ServiceBusMessage(
                            "1",
                            subject="order",
                            application_properties={"amount": 150, "region": "eu-west", "internal": "x"},
                        ),
                        ServiceBusMessage("2", subject="order", application_properties={"amount": 5}),
                        ServiceBusMessage(
                            "3",
                            correlation_id="c-42",
                            application_properties={"amount": 500, "region": "us-east"},
                        ),
                    ]
                )
            big = _receive_all(sb, "orders", "big", 1)
            assert [str(m) for m in big] == ["1"]
            props = {k.decode(): v for k, v in big[0].application_properties.items()}
            assert props["priority"] == b"high" or props["priority"] == "high"
            assert "internal" not in props and props["amount"] == 150
            assert props["RuleName"] in (b"big-orders", "big-orders")
            assert big[0].subject == "big-order"
            assert sorted(str(m) for m in _receive_all(sb, "orders", "eu", 2)) == ["1", "2"]
            assert [str(m) for m in _receive_all(sb, "orders", "corr", 1)] == ["3"]
            assert _receive_all(sb, "orders", "none", 0) == []
            assert sorted(str(m) for m in _receive_all(sb, "orders", "all", 3)) == ["1", "2", "3"]
            assert sorted(str(m) for m in _receive_all(sb, "orders", "twice", 3)) == ["1", "2", "3"]
        # the action changed the subscription's copy only
        assert ns.broker.get_subscription("orders", "big").runtime.active_message_count == 0


def test_subscription_without_rules_gets_nothing_and_default_rule_restored() -> None:
    with LocalNamespace("norules", topics={"t": ["s"]}) as ns, ns.admin_client() as admin:
        admin.delete_rule("t", "s", "$Default")
        assert list(admin.list_rules("t", "s")) == []
        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_topic_sender("t") as sender:
                sender.send_messages(ServiceBusMessage("lost"))
            assert ns.broker.get_subscription("t", "s").runtime.active_message_count == 0
            admin.create_rule("t", "s", "$Default", filter=TrueRuleFilter())
            with sb.get_topic_sender("t") as sender:
                sender.send_messages(ServiceBusMessage("kept"))
            assert [str(m) for m in _receive_all(sb, "t", "s", 1)] == ["kept"]


def test_rule_crud_sync() -> None:
    with LocalNamespace("crud", topics={"t": ["s"]}) as ns, ns.admin_client() as admin:
        created = admin.create_rule(
            "t",
            "s",
            "r1",
            filter=SqlRuleFilter("a = @p AND b > @q", parameters={"@p": "x", "@q": 1.5}),
            action=SqlRuleAction("SET c = @v", parameters={"@v": 7}),
        )
        assert isinstance(created.filter, SqlRuleFilter)
        assert created.filter.sql_expression == "a = @p AND b > @q"
        assert dict(created.filter.parameters) == {"@p": "x", "@q": 1.5}
        assert isinstance(created.action, SqlRuleAction) and dict(created.action.parameters) == {"@v": 7}
        assert created.created_at_utc is not None
        admin.create_rule(
            "t",
            "s",
            "r2",
            filter=CorrelationRuleFilter(
                correlation_id="c",
                message_id="m",
                to="to",
                reply_to="rt",
                label="l",
                session_id="sid",
                reply_to_session_id="rsid",
                content_type="ct",
                properties={"k": "v", "n": 3, "flag": True},
            ),
        )
        got = admin.get_rule("t", "s", "r2")
        f = got.filter
        assert isinstance(f, CorrelationRuleFilter)
        assert (f.correlation_id, f.message_id, f.to, f.reply_to, f.label) == ("c", "m", "to", "rt", "l")
        assert (f.session_id, f.reply_to_session_id, f.content_type) == ("sid", "rsid", "ct")
        assert dict(f.properties) == {"k": "v", "n": 3, "flag": True}
        assert [r.name for r in admin.list_rules("t", "s")] == ["$Default", "r1", "r2"]
        with pytest.raises(ResourceExistsError):
            admin.create_rule("t", "s", "r1")
        got.filter = FalseRuleFilter()
        admin.update_rule("t", "s", got)
        assert isinstance(admin.get_rule("t", "s", "r2").filter, FalseRuleFilter)
        admin.delete_rule("t", "s", "r1")
        with pytest.raises(ResourceNotFoundError):
            admin.get_rule("t", "s", "r1")
        with pytest.raises(ResourceNotFoundError):
            admin.delete_rule("t", "s", "r1")
        with pytest.raises(HttpResponseError) as caught:
            admin.create_rule("t", "s", "bad", filter=SqlRuleFilter("amount >> 5"))
        assert caught.value.status_code == 400
        assert "column 9" in str(caught.value) and "position 8" in str(caught.value)
        with pytest.raises(HttpResponseError) as caught:
            admin.create_rule("t", "s", "bad", action=SqlRuleAction("SET x ="))
        assert caught.value.status_code == 400 and "column 8" in str(caught.value)
        assert [r.name for r in admin.list_rules("t", "s")] == ["$Default", "r2"]


def test_rule_crud_async(monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.core.pipeline.transport as transports
    from azure.core.pipeline.transport import AsyncioRequestsTransport

    try:
        import aiohttp  # noqa: F401 - the async admin client's default transport
    except ImportError:
        # aiohttp is not a dependency of this project: the unmodified async client runs on azure-core's
        # requests-based asyncio transport instead (its module imports AioHttpTransport by name).
        monkeypatch.setitem(vars(transports), "AioHttpTransport", AsyncioRequestsTransport)
    from azure.servicebus.aio.management import ServiceBusAdministrationClient as AsyncAdmin

    async def scenario(ns: LocalNamespace) -> None:
        async with AsyncAdmin.from_connection_string(
            ns.connection_string, transport=AsyncioRequestsTransport(connection_verify=ns.ca_file)
        ) as admin:
            await admin.create_rule("t", "s", "vip", filter=SqlRuleFilter("vip = TRUE"))
            rule = await admin.get_rule("t", "s", "vip")
            assert isinstance(rule.filter, SqlRuleFilter) and rule.filter.sql_expression == "vip = TRUE"
            names = [r.name async for r in admin.list_rules("t", "s")]
            assert names == ["$Default", "vip"]
            rule.action = SqlRuleAction("SET seen = 1")
            await admin.update_rule("t", "s", rule)
            updated = await admin.get_rule("t", "s", "vip")
            assert (
                isinstance(updated.action, SqlRuleAction) and updated.action.sql_expression == "SET seen = 1"
            )
            with pytest.raises(HttpResponseError) as caught:
                await admin.create_rule("t", "s", "bad", filter=SqlRuleFilter("vip IN (1,"))
            assert caught.value.status_code == 400 and "position 10" in str(caught.value)
            await admin.delete_rule("t", "s", "$Default")
            await admin.delete_rule("t", "s", "vip")
            assert [r.name async for r in admin.list_rules("t", "s")] == []

    with LocalNamespace("crud-async", topics={"t": ["s"]}) as ns:
        asyncio.run(scenario(ns))


TOPOLOGY = """
topics:
  - name: orders
    subscriptions:
      - everything
      - name: big
        rules:
          - name: big
            filter: "amount > @min"
            parameters: {"@min": 100}
            action: "SET priority = 'high'"
          - name: by-corr
            correlation: {correlation_id: c-1, properties: {region: eu}}
      - name: closed
        rules:
          - name: nothing
            filter: false
"""


def test_rules_declared_in_a_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    with LocalNamespace("topo-rules", topology=path) as ns, ns.admin_client() as admin:
        assert [r.name for r in admin.list_rules("orders", "everything")] == ["$Default"]
        assert [r.name for r in admin.list_rules("orders", "big")] == ["big", "by-corr"]
        big = admin.get_rule("orders", "big", "big")
        assert isinstance(big.filter, SqlRuleFilter) and dict(big.filter.parameters) == {"@min": 100}
        assert isinstance(big.action, SqlRuleAction)
        assert isinstance(admin.get_rule("orders", "big", "by-corr").filter, CorrelationRuleFilter)
        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_topic_sender("orders") as sender:
                sender.send_messages(
                    [
                        ServiceBusMessage("small", application_properties={"amount": 1}),
                        ServiceBusMessage("large", application_properties={"amount": 1000}),
                        ServiceBusMessage(
                            "corr", correlation_id="c-1", application_properties={"region": "eu"}
                        ),
                    ]
                )
            assert sorted(str(m) for m in _receive_all(sb, "orders", "big", 2)) == ["corr", "large"]
            assert len(_receive_all(sb, "orders", "everything", 3)) == 3
            assert _receive_all(sb, "orders", "closed", 0) == []


def test_topology_rules_refused_with_a_clear_error() -> None:
    def topo(rule: str) -> dict[str, Any]:
        import yaml

        return yaml.safe_load(
            f"topics:\n  - name: t\n    subscriptions:\n      - name: s\n        rules:\n{rule}"
        )  # type: ignore[no-any-return]

    with pytest.raises(TopologyError, match=r"subscription t/s rule 'r'.*column 4 \(position 3\)"):
        parse_topology(topo("          - {name: r, filter: 'a == 1'}"))
    with pytest.raises(TopologyError, match="unknown keys"):
        parse_topology(topo("          - {name: r, fliter: 'a = 1'}"))
    with pytest.raises(TopologyError, match="not both"):
        parse_topology(topo("          - {name: r, filter: 'a = 1', correlation: {label: x}}"))
    with pytest.raises(TopologyError, match="action"):
        parse_topology(topo("          - {name: r, action: 'SET'}"))


def test_filter_evaluation_error_dead_letters_the_subscriptions_copy() -> None:
    with LocalNamespace("filter-error", topics={"t": ["s"]}) as ns, ns.admin_client() as admin:
        admin.delete_rule("t", "s", "$Default")
        admin.create_rule("t", "s", "ratio", filter=SqlRuleFilter("a / b > 1"))
        with ServiceBusClient.from_connection_string(ns.connection_string) as sb:
            with sb.get_topic_sender("t") as sender:
                sender.send_messages(
                    [
                        ServiceBusMessage("ok", application_properties={"a": 10, "b": 2}),
                        ServiceBusMessage("zero", application_properties={"a": 10, "b": 0}),
                    ]
                )
            assert [str(m) for m in _receive_all(sb, "t", "s", 1)] == ["ok"]
            with sb.get_subscription_receiver("t", "s", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                (msg,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                assert str(msg) == "zero" and msg.dead_letter_reason == "FilterEvaluationException"
                assert "division by zero" in (msg.dead_letter_error_description or "")
                receiver.complete_message(msg)


def test_the_example_topology_file_parses() -> None:
    from servicebus_local.topology import load_topology

    topology = load_topology(Path(__file__).parents[2] / "conf" / "local.topology.yaml")
    (events,) = topology.topics
    by_name = {s.name: s for s in events.subscriptions}
    assert by_name["audit"].rules is None
    rules = by_name["big-orders"].rules
    assert rules is not None and [r.name for r in rules] == ["big", "eu-batch"]
    assert isinstance(rules[1].filter, CorrelationFilter) and rules[0].action is not None
    assert by_name["per-customer"].settings.requires_session
