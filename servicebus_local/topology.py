"""Topology files for the local namespace: queues, topics and subscriptions with their settings (YAML).

Used by ``python -m servicebus_local --topology <file>`` and ``LocalNamespace(topology=...)``; runs wherever the
namespace is started. Format (every settings key is a field name of
:class:`~servicebus_local.model.QueueSettings` / ``TopicSettings`` / ``SubscriptionSettings``; a bare string
is a name with default settings)::

    queues:
      - orders                      # default settings
      - name: payments
        lock_duration: 30s          # durations: ISO-8601 (PT30S), seconds (30), or 500ms / 30s / 5m / 2h / 14d
        max_delivery_count: 5
        requires_duplicate_detection: true
        duplicate_detection_history_time_window: 10m
    topics:
      - name: events
        max_size_in_megabytes: 2048
        subscriptions:
          - audit
          - name: billing
            requires_session: true
          - name: big-orders
            rules:                  # replace $Default (no rules listed: $Default, a true filter)
              - name: big
                filter: "amount > @min AND sys.Label = 'order'"   # SQL filter (or true / false)
                parameters: {"@min": 100}
                action: "SET priority = 'high'; REMOVE internal"  # optional SQL action
              - name: by-correlation
                correlation: {correlation_id: abc, label: order, properties: {region: eu}}

An existing entity is left as it is (the file creates what is missing; rules are set on subscriptions the file
creates).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import yaml

from servicebus_local.durations import MAX_DURATION, parse_iso_duration
from servicebus_local.model import MAX_LOCK_DURATION, QueueSettings, SubscriptionSettings, TopicSettings
from servicebus_local.rules import (
    CORRELATION_FIELDS,
    CorrelationFilter,
    FalseFilter,
    Filter,
    Rule,
    SqlAction,
    SqlSyntaxError,
    TrueFilter,
    parse_filter,
)

__all__ = ["Topology", "TopologyError", "apply_topology", "load_topology", "parse_topology"]

S = TypeVar("S", QueueSettings, TopicSettings, SubscriptionSettings)


class TopologyError(ValueError):
    """The topology file is not valid (the message names the entity and the key)."""


@dataclass
class SubscriptionSpec:
    name: str
    settings: SubscriptionSettings
    rules: list[Rule] | None = None


@dataclass
class TopicSpec:
    name: str
    settings: TopicSettings
    subscriptions: list[SubscriptionSpec] = field(default_factory=list)


@dataclass
class QueueSpec:
    name: str
    settings: QueueSettings


@dataclass
class Topology:
    queues: list[QueueSpec] = field(default_factory=list)
    topics: list[TopicSpec] = field(default_factory=list)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any, where: str) -> timedelta:
    """A duration from YAML: ISO-8601, a number of seconds, ``max``, or ``<n><ms|s|m|h|d>``."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise TopologyError(f"{where}: a duration is expected, got {value!r}")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("max", "unlimited"):
            return MAX_DURATION
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", text)
        if m:
            return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
        try:
            iso = parse_iso_duration(text)
        except (ValueError, OverflowError):
            iso = None
        if iso is not None and iso >= timedelta(0):
            return iso
    raise TopologyError(
        f"{where}: cannot read {value!r} as a duration (e.g. PT30S, 30, 30s, 5m, 2h, 14d, max)"
    )


def _settings(cls: type[S], raw: dict[str, Any], where: str) -> S:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    base = cls()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise TopologyError(
                f"{where}: unknown setting {key!r}; valid settings: {', '.join(sorted(fields))}"
            )
        current = getattr(base, key)
        if isinstance(current, timedelta):
            values[key] = parse_duration(value, f"{where}.{key}")
            if key == "lock_duration" and values[key] > MAX_LOCK_DURATION:
                raise TopologyError(
                    f"{where}.{key}: at most 5m (the service's maximum lock duration), got {value!r}"
                )
        elif isinstance(current, bool):
            if not isinstance(value, bool):
                raise TopologyError(f"{where}.{key}: true or false expected, got {value!r}")
            values[key] = value
        elif isinstance(current, int) or str(fields[key].type) == "int | None":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TopologyError(f"{where}.{key}: an integer is expected, got {value!r}")
            values[key] = value
        else:
            values[key] = None if value is None else str(value)
    return dataclasses.replace(base, **values)


def _named(item: Any, where: str) -> tuple[str, dict[str, Any]]:
    if isinstance(item, str):
        return item, {}
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        rest = {k: v for k, v in item.items() if k != "name"}
        nested = rest.pop("settings", None)
        if nested is not None:
            if not isinstance(nested, dict):
                raise TopologyError(f"{where}: 'settings' must be a mapping")
            rest = {**nested, **rest}
        return item["name"], rest
    raise TopologyError(f"{where}: expected a name or a mapping with 'name', got {item!r}")


def parse_topology(data: Any) -> Topology:
    """A :class:`Topology` from parsed YAML (a mapping with optional ``queues`` and ``topics`` lists)."""
    if data is None:
        return Topology()
    if not isinstance(data, dict):
        raise TopologyError("topology: a mapping with 'queues' and/or 'topics' is expected")
    unknown = set(data) - {"queues", "topics"}
    if unknown:
        raise TopologyError(f"topology: unknown keys {sorted(unknown)}; valid keys: queues, topics")
    topo = Topology()
    for i, item in enumerate(data.get("queues") or []):
        name, raw = _named(item, f"queues[{i}]")
        topo.queues.append(QueueSpec(name, _settings(QueueSettings, raw, f"queue {name!r}")))
    for i, item in enumerate(data.get("topics") or []):
        name, raw = _named(item, f"topics[{i}]")
        subs_raw = raw.pop("subscriptions", None) or []
        spec = TopicSpec(name, _settings(TopicSettings, raw, f"topic {name!r}"))
        for j, sub in enumerate(subs_raw):
            sname, sraw = _named(sub, f"topic {name!r} subscriptions[{j}]")
            rules_raw = sraw.pop("rules", None)
            where = f"subscription {name}/{sname}"
            spec.subscriptions.append(
                SubscriptionSpec(
                    sname,
                    _settings(SubscriptionSettings, sraw, where),
                    None if rules_raw is None else _rules(rules_raw, where),
                )
            )
        topo.topics.append(spec)
    return topo


_RULE_KEYS = ("name", "filter", "parameters", "correlation", "action", "action_parameters")


def _rules(raw: Any, where: str) -> list[Rule]:
    if not isinstance(raw, list):
        raise TopologyError(f"{where}: 'rules' must be a list")
    rules: list[Rule] = []
    for k, item in enumerate(raw):
        at = f"{where} rules[{k}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise TopologyError(f"{at}: a mapping with 'name' is expected")
        unknown = set(item) - set(_RULE_KEYS)
        if unknown:
            raise TopologyError(f"{at}: unknown keys {sorted(unknown)}; valid keys: {', '.join(_RULE_KEYS)}")
        at = f"{where} rule {item['name']!r}"
        if "filter" in item and "correlation" in item:
            raise TopologyError(f"{at}: give 'filter' or 'correlation', not both")
        rule_filter: Filter
        try:
            if "correlation" in item:
                corr = item["correlation"]
                if not isinstance(corr, dict):
                    raise TopologyError(f"{at}.correlation: a mapping is expected")
                bad = set(corr) - set(CORRELATION_FIELDS) - {"properties"}
                if bad:
                    valid = ", ".join([*CORRELATION_FIELDS, "properties"])
                    raise TopologyError(f"{at}.correlation: unknown keys {sorted(bad)}; valid keys: {valid}")
                fields = {
                    key: None if v is None else str(v) for key, v in corr.items() if key != "properties"
                }
                rule_filter = CorrelationFilter(**fields, properties=dict(corr.get("properties") or {}))
            else:
                text = item.get("filter", True)
                if text is True:
                    rule_filter = TrueFilter()
                elif text is False:
                    rule_filter = FalseFilter()
                elif isinstance(text, str):
                    rule_filter = parse_filter(text, dict(item.get("parameters") or {}))
                else:
                    raise TopologyError(f"{at}.filter: a SQL expression, true or false is expected")
            action_text = item.get("action")
            action = None
            if action_text is not None:
                if not isinstance(action_text, str):
                    raise TopologyError(f"{at}.action: a SQL action (SET ... / REMOVE ...) is expected")
                try:
                    action = SqlAction(action_text, dict(item.get("action_parameters") or {}))
                except SqlSyntaxError as exc:
                    raise TopologyError(f"{at}.action: {exc}") from None
        except SqlSyntaxError as exc:
            raise TopologyError(f"{at}.filter: {exc}") from None
        rules.append(Rule(item["name"], rule_filter, action))
    return rules


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read a topology YAML file."""
    with open(path, encoding="utf-8") as fh:
        return parse_topology(yaml.safe_load(fh))


def apply_topology(store: Any, topology: Topology) -> None:
    """Create the missing entities of ``topology`` in a broker (``servicebus_local.broker.Broker``).

    Forwarding is set once every entity of the file exists, so a ``forward_to`` may name an entity declared
    further down; a destination that is not a queue or topic of the namespace -> :class:`TopologyError`."""
    from servicebus_local.model import EntityNotFound, InvalidSettings

    forwarding: list[tuple[str, Callable[[], object]]] = []
    for q in topology.queues:
        try:
            store.get_queue(q.name)
        except EntityNotFound:
            try:
                store.create_queue(q.name, _without_forwarding(q.settings))
            except InvalidSettings as exc:  # e.g. a message size limit the namespace's tier does not allow
                raise TopologyError(f"queue {q.name!r}: {_one_line(exc)}") from None
            if _forwards(q.settings):
                forwarding.append(
                    (f"queue {q.name!r}", functools.partial(store.update_queue, q.name, q.settings))
                )
    for t in topology.topics:
        try:
            store.ensure_topic(t.name, (), t.settings)
        except InvalidSettings as exc:
            raise TopologyError(f"topic {t.name!r}: {_one_line(exc)}") from None
        for s in t.subscriptions:
            try:
                store.get_subscription(t.name, s.name)
            except EntityNotFound:
                store.create_subscription(t.name, s.name, _without_forwarding(s.settings))
                if s.rules is not None:
                    store.set_rules(t.name, s.name, s.rules)
                if _forwards(s.settings):
                    update = functools.partial(store.update_subscription, t.name, s.name, s.settings)
                    forwarding.append((f"subscription {t.name}/{s.name}", update))
    for where, set_forwarding in forwarding:
        try:
            set_forwarding()
        except InvalidSettings as exc:
            raise TopologyError(f"{where}: {exc}") from None


F = TypeVar("F", QueueSettings, SubscriptionSettings)


def _one_line(exc: Exception) -> str:
    """The service's text of a refusal (lines joined by CRLF, as its 400 bodies) on one line."""
    return " ".join(str(exc).split("\r\n"))


def _forwards(settings: QueueSettings | SubscriptionSettings) -> bool:
    return bool(settings.forward_to or settings.forward_dead_lettered_messages_to)


def _without_forwarding(settings: F) -> F:
    return dataclasses.replace(settings, forward_to=None, forward_dead_lettered_messages_to=None)
