"""Writes docs/configuration.md, the configuration reference, from the configuration model, so that it cannot drift.

Every key is :data:`spark_sb.config.settings.KNOWN_KEYS`; how a key is read (duration, integer, one of ...) and its
bounds come from its row of :data:`~spark_sb.config.settings.SETTINGS` (or
:data:`~spark_sb.config.settings.NAMESPACE_READERS`); its default from the dataclasses it fills
(:class:`~spark_sb.config.service_bus.ServiceBusConfig`, ``RetryConfig``, ``NamespaceConfig``, ``CredentialConfig``);
what it is for from its comment in conf/example.yaml (the file that lists every key, tests/unit/test_readme.py).
A number whose unit the model does not say takes it from :data:`UNITS`; a new one without a unit there is an error
here, not a blank cell.

Run: ``python docs/gen_config_reference.py`` (``make docs`` does, before ``mkdocs build``); ``--check`` exits 1
when the committed page differs. tests/unit/test_docs.py fails when it does.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "conf" / "example.yaml"

#: The unit of a number the model does not state itself (durations are seconds, ``max_message_size`` says bytes).
UNITS = {
    "backlog_queue_count": "queues",
    "retry.total": "SDK retries",
    "retry.backoff_factor": "seconds",
    "retry.backoff_max": "seconds",
    "syphon.batch_size": "messages",
    "syphon.prefetch": "messages",
    "syphon.max_attempts": "deliveries",
    "provision.tries": "attempts",
}

#: What a key is for, where conf/example.yaml has no comment on its line.
DESCRIPTIONS = {
    "primary.connection_string": "a SAS connection string (a secret reference); or give `fully_qualified_namespace`",
    "primary.fully_qualified_namespace": "`<name>.servicebus.windows.net`, with `credential.*` (Azure AD)",
    "primary.credential.tenant_id": "the Azure AD tenant (`client_secret`, `default`)",
    "primary.credential.client_id": "the application (client) id",
    "primary.credential.client_secret": "a secret reference; only with `kind: client_secret`",
    "secondary.connection_string": "absent: no failover (a plain sender, no backlog queues)",
    "primary.credential.kind": "how to sign in (azure-identity): `DefaultAzureCredential`, a service principal, a "
    "managed identity",
    "ping_primary_interval": "how often a failed-over entity (or namespace) is probed",
    "probe_mode": "`schedule-cancel`: a message scheduled far ahead, then cancelled (no receiver sees it); `ping`: "
    "a 1 s ping that receivers drop (`spark_sb.is_probe`)",
    "backlog_retry_interval": "how long a failing backlog queue stays out of the rotation",
    "backlog_selection": "which backlog queue a failed-over message goes to: one at random (sticky), or one per "
    "session",
    "on_reject": "a row that cannot become a message: recorded in the `rejects` table, or the batch fails",
    "retry.total": "the SDK's retries inside one call: 0 (each layer retries within its own deadlines)",
    "max_message_size": "the largest message sent (256 KiB on Standard); on Premium raise it to the entities' limit: a message over a link's 1 MB batch limit goes alone",
    "state_writes": "`async`: a background group commit (`flush()` before `spark.stop()`); `sync`: in each batch",
    "retry.backoff_factor": "the first pause between tries of a send",
    "retry.backoff_max": "the longest pause between tries of a send",
    "syphon.batch_size": "messages per receive",
    "syphon.prefetch": "the syphon receivers' prefetch",
    "client_cache": "executors keep their senders between micro-batches",
    "exactly_once_horizon": "the longest outage a diverted message must survive exactly once: `spark-sb "
    "provision` and `status` warn of a primary entity whose duplicate detection is off or has a shorter window",
}

#: Groups of the page: title, and which keys (by prefix; the first group that matches takes a key).
GROUPS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("Namespaces: `primary.*`, `secondary.*`", lambda k: k.startswith(("primary.", "secondary."))),
    ("Sender retries: `retry.*`", lambda k: k.startswith("retry.")),
    ("The syphon: `syphon.*`", lambda k: k.startswith("syphon.")),
    ("Provisioning: `provision.*`", lambda k: k.startswith("provision.")),
    ("Columns: `columns.*`", lambda k: k.startswith("columns.")),
    ("Sending, failover and state", lambda k: True),
)

_DURATION_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60))


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    kind: str  # how it is read: "duration > 0", "one of `a`, `b`", ...
    default: str
    unit: str
    description: str


def duration_text(seconds: float) -> str:
    """A default in seconds, with its size in words from a minute up: ``30`` -> ```30```, ``60.0`` -> ```60` (1
    minute)``, ``2592000`` -> ```2592000` (30 days)``."""
    for name, size in _DURATION_UNITS:
        if seconds >= size and float(seconds / size).is_integer():
            count = int(seconds // size)
            return f"`{int(seconds)}` ({count} {name}{'s' if count != 1 else ''})"
    return f"`{seconds:g}`"


def _nonlocals(fn: Callable[..., Any]) -> dict[str, Any]:
    return dict(inspect.getclosurevars(fn).nonlocals) if inspect.isfunction(fn) else {}


def _kind(read: Callable[..., Any], check: Callable[..., Any] | None) -> tuple[str, str]:
    """(how the value is read, with its bound; its unit when the model says it)."""
    from spark_sb.config import settings
    from spark_sb.core.durations import parse_duration

    valid = _nonlocals(read).get("valid")
    if valid is not None:
        return "one of " + ", ".join(f"`{v}`" for v in valid), ""
    closure = _nonlocals(check) if check is not None else {}
    if read is parse_duration:
        positive = closure.get("positive")
        return "duration" + (" > 0" if positive else " >= 0" if positive is False else ""), "seconds"
    if read is settings.parse_int:
        bound = closure.get("bound")
        unit = str(closure.get("unit", "")).strip(" ()")
        return "integer" + (f" {bound}" if bound else " >= 0"), unit
    if read is settings.parse_float:
        return "number >= 0", ""
    if read is settings.parse_bool:
        return "boolean", ""
    if read is settings.parse_secret_text:
        return "secret", ""
    if read is settings.parse_str:
        return "string", ""
    raise ValueError(f"no description of how {read!r} reads a value: add it to docs/gen_config_reference.py")


def _defaults() -> dict[str, Any]:
    """Each key's default, from the dataclasses the keys fill."""
    from spark_sb.config.namespace import CredentialConfig, NamespaceConfig, RetryConfig
    from spark_sb.config.service_bus import ServiceBusConfig
    from spark_sb.config.settings import SETTINGS
    from spark_sb.message.rows import LOGICAL_COLUMNS

    def field_defaults(cls: type) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out

    config, retry = field_defaults(ServiceBusConfig), field_defaults(RetryConfig)
    found: dict[str, Any] = {}
    for s in SETTINGS:
        found[s.key] = (retry if s.owner == "retry" else config)[s.attr]
    namespace, credential = field_defaults(NamespaceConfig), field_defaults(CredentialConfig)
    for ns in ("primary", "secondary"):
        for name, value in namespace.items():
            found[f"{ns}.{name}"] = value
        for name, value in credential.items():
            found[f"{ns}.credential.{name}"] = value
    for c in LOGICAL_COLUMNS:
        found[f"columns.{c}"] = c
    return found


def example_comments(text: str) -> dict[str, str]:
    """Dotted key -> the comment on its line of conf/example.yaml (set or commented out), first line only."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        m = re.match(r"^(\s*)(?:#\s?(\s*))?([a-z_][\w-]*):(.*)$", line)
        if not m:
            continue
        indent = len(m.group(1)) + len(m.group(2) or "")
        key, rest = m.group(3), m.group(4)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([*(k for _, k in stack), key])
        value, _, comment = rest.partition("#")
        if not value.strip():
            stack.append((indent, key))
        # "a | b: what" and "a | b (what)": the valid values are the table's own column
        comment = re.sub(r"^[\w-]+(?:\s*\|\s*[\w-]+)+\s*:?\s*", "", comment.strip())
        comment = re.sub(r"^\((.*)\)$", r"\1", comment).strip()
        if comment and not comment.startswith(("(", "runs out")):
            found.setdefault(dotted, comment)
    return found


def _default_text(key: str, value: Any, kind: str) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if kind.startswith("duration"):
        return duration_text(float(value))
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    return f"`{value}`"


def rows(known_keys: Iterable[str] | None = None, settings_rows: Iterable[Any] | None = None) -> list[Row]:
    """One row per configuration key (``known_keys``: KNOWN_KEYS; ``settings_rows``: SETTINGS), in their order."""
    from spark_sb.config import settings

    known = list(settings.KNOWN_KEYS if known_keys is None else known_keys)
    by_key = {s.key: s for s in (settings.SETTINGS if settings_rows is None else settings_rows)}
    defaults = _defaults()
    comments = example_comments(EXAMPLE.read_text())
    out = []
    for key in known:
        setting = by_key.get(key)
        if setting is not None:
            kind, unit = _kind(setting.read, setting.check)
        else:
            part = key.split(".", 1)[1] if key.startswith(("primary.", "secondary.")) else None
            read = settings.NAMESPACE_READERS[part] if part is not None else settings.READERS[key]
            kind, unit = _kind(read, None)
        unit = unit or UNITS.get(key, "")
        if kind.startswith(("integer", "number", "duration")) and not unit:
            raise ValueError(
                f"{key}: a number without a unit; add it to UNITS in docs/gen_config_reference.py"
            )
        twin = key.replace("secondary.", "primary.", 1)
        description = DESCRIPTIONS.get(key) or DESCRIPTIONS.get(twin) or comments.get(twin, "")
        if key.startswith("columns.") and not description:
            description = f"the column holding the message's `{key.split('.', 1)[1]}`"
        default = _default_text(key, defaults.get(key), kind)
        out.append(Row(key, kind, default, unit, description))
    return out


HEADER = """\
# Configuration reference

<!-- Generated by docs/gen_config_reference.py from the configuration model (spark_sb/config): do not edit by
hand; `make docs` writes it again, and tests/unit/test_docs.py fails when it differs. -->

Every configuration key, its default and its unit. Keys are given as nested YAML (`conf/example.yaml` lists every
one of them; `conf/local.yaml` is set up for the two local namespaces), as a dict, or as flat dotted Spark options
(`.option("primary.connection_string", ...)`, `failover_interval`, ...), and loaded with
`spark_sb.load_config(...)`. A bad value raises `ConfigError`, which names the key and lists the valid values.

- **Durations** accept `30`, `30s`, `5m`, `250ms`, `2d` or ISO-8601 `PT1M`; they are seconds.
- **Secrets** are never written literally: `${env:NAME}` or, on Databricks, `{{secrets/<scope>/<key>}}`.
  Connection strings and keys are redacted in reprs, logs, exception texts and reject rows
  (`spark_sb.core.redact`).
- **Authentication**: a SAS connection string, or `fully_qualified_namespace` with `credential.kind`
  (azure-identity).
- **`x-*` keys** are your own, kept in `ServiceBusConfig.extra` unread; any other unknown key is an error.
- **`secondary.*`** takes the same keys as `primary.*`; without a secondary there is no failover.
- **Settings that cannot work together**, each valid alone, are refused when the configuration is loaded, in one
  line naming both: a secondary that is the primary spelled another way (case, a trailing dot, the default port),
  `retry.backoff_max` below `retry.backoff_factor`, `state_location` with `state_table_prefix`,
  `use_development_emulator` beside a connection string without `UseDevelopmentEmulator=true`,
  `credential.tenant_id` with `kind: managed_identity`. A connection string with an `EntityPath` is refused too:
  the sink shares one connection per namespace among its entities and backlog queues, which such a string's
  client cannot open.
- **Not configuration keys**: the data source's own options (`config_path`, `state_spool`, `job_id`: [the data
  source](datasource.md)) and the source's (`maxMessagesPerTrigger`, ...: [reading](source.md)).
"""


def _cell(text: str) -> str:
    """Text in a table cell: a pipe escaped, and ``<name>`` shown as text, not read as an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def render(table: list[Row] | None = None) -> str:
    """The page: the header, then one table per group."""
    table = rows() if table is None else table
    groups: dict[str, list[Row]] = {title: [] for title, _ in GROUPS}
    for row in table:
        title = next(t for t, match in GROUPS if match(row.key))
        groups[title].append(row)
    parts = [HEADER]
    for title, members in groups.items():
        if not members:
            continue
        parts.append(
            f"\n## {title}\n\n| key | value | default | unit | what it is |\n|---|---|---|---|---|\n"
        )
        for r in members:
            parts.append(
                f"| `{r.key}` | {_cell(r.kind)} | {_cell(r.default)} | {r.unit or '-'} | {_cell(r.description)} |\n"
            )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(
                f"{PAGE.relative_to(ROOT)} differs from the configuration model: run make docs",
                file=sys.stderr,
            )
            return 1
        return 0
    if not PAGE.exists() or PAGE.read_text() != text:
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
