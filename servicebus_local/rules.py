"""Subscription rules of the local namespace: SQL filters and actions, correlation, true and false filters.

A topic message is copied to a subscription when one of the subscription's rules matches it (the service's
semantics, see "Topic filters and actions" in the Service Bus documentation):

* every subscription starts with the rule ``$Default`` (a true filter); rules are added, replaced and removed
  through the administration client or declared in topology files;
* the matching rules without an action together give one copy; each matching rule with an action gives a copy
  of its own, with the action (``SET`` / ``REMOVE``) applied to that copy only and the application property
  ``RuleName`` set to the rule's name; no matching rule, no copy.

The SQL dialect is the service's (a subset of SQL-92): comparisons (``= <> != < <= > >=``), ``AND``, ``OR``,
``NOT``, ``[NOT] IN (...)``, ``[NOT] LIKE 'pattern' [ESCAPE 'c']``, ``IS [NOT] NULL``, ``EXISTS(property)``,
arithmetic (``+ - * / %``, unary ``+ -``), string literals (``'it''s'``), integer, decimal and exponent
literals, ``TRUE`` / ``FALSE`` / ``NULL``, ``@parameters``, ``newid()``, properties as ``name``,
``user.name``, ``sys.Name`` or ``[delimited name]``. Comparisons with a missing property or across types are
*unknown* (three-valued logic: a filter matches only when it evaluates to true).

:func:`parse_filter` / :func:`parse_action` refuse an expression that does not parse with
:class:`SqlSyntaxError`, which names the position (the admin endpoint answers 400 with that text).

Pure code, no I/O; runs inside the local namespace (its server thread, admin threads, tests).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

__all__ = [
    "DEFAULT_RULE_NAME",
    "CorrelationFilter",
    "FalseFilter",
    "FilterEvaluationError",
    "MessageView",
    "Rule",
    "RuleFilter",
    "SqlAction",
    "SqlFilter",
    "SqlSyntaxError",
    "TrueFilter",
    "default_rule",
    "parse_action",
    "parse_filter",
    "route",
]

DEFAULT_RULE_NAME = "$Default"


class SqlSyntaxError(ValueError):
    """A filter or action that does not parse; ``position`` is the 0-based offset of the offending text."""

    def __init__(self, message: str, text: str, position: int) -> None:
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        super().__init__(f"{message} at line {line}, column {column} (position {position})")
        self.position = position
        self.line = line
        self.column = column


class FilterEvaluationError(ValueError):
    """A filter failed while evaluated against a message (e.g. a division by zero)."""


# ----------------------------------------------------------------------------------------------------------
# the message as filters see it


#: sys.* names (lower case) -> canonical name (how a SET writes them back).
SYSTEM_PROPERTIES = {
    name.lower(): name
    for name in (
        "MessageId",
        "CorrelationId",
        "To",
        "ReplyTo",
        "Label",
        "SessionId",
        "ReplyToSessionId",
        "ContentType",
        "Size",
        "DeliveryCount",
        "SequenceNumber",
        "EnqueuedSequenceNumber",
        "EnqueuedTimeUtc",
        "ScheduledEnqueueTimeUtc",
        "ExpiresAtUtc",
        "TimeToLive",
        "PartitionKey",
    )
}
SYSTEM_PROPERTIES["subject"] = "Label"


@dataclass
class MessageView:
    """What a filter reads and an action writes: system properties (keys canonical, see
    :data:`SYSTEM_PROPERTIES`) and application properties."""

    system: dict[str, Any] = field(default_factory=dict)
    user: dict[str, Any] = field(default_factory=dict)

    def get(self, scope: str, name: str) -> tuple[bool, Any]:
        """(present, value) of a property."""
        if scope == "sys":
            canonical = SYSTEM_PROPERTIES.get(name.lower())
            if canonical is None or canonical not in self.system:
                return False, None
            return True, self.system[canonical]
        if name in self.user:
            return True, self.user[name]
        return False, None


# ----------------------------------------------------------------------------------------------------------
# lexer

_KEYWORDS = frozenset(
    {"and", "or", "not", "is", "null", "in", "like", "escape", "exists", "true", "false", "set", "remove"}
)


@dataclass(frozen=True)
class _Token:
    kind: str  # num | str | ident | delim | param | op | kw | end
    text: str
    pos: int
    value: Any = None


_NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = ("<>", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",", ".", ";")


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c == "'":
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise SqlSyntaxError("unterminated string literal", text, i)
                if text[j] == "'":
                    if j + 1 < n and text[j + 1] == "'":
                        buf.append("'")
                        j += 2
                        continue
                    break
                buf.append(text[j])
                j += 1
            out.append(_Token("str", text[i : j + 1], i, "".join(buf)))
            i = j + 1
            continue
        if c == "[":
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise SqlSyntaxError("unterminated delimited name", text, i)
                if text[j] == "]":
                    if j + 1 < n and text[j + 1] == "]":
                        buf.append("]")
                        j += 2
                        continue
                    break
                buf.append(text[j])
                j += 1
            out.append(_Token("delim", text[i : j + 1], i, "".join(buf)))
            i = j + 1
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            assert m is not None
            literal = m.group(0)
            if m.group(2) is None and "." not in literal:
                value: Any = int(literal)
            else:
                value = float(literal)
            end = m.end()
            if end < n and (text[end].isalpha() or text[end] == "_"):
                raise SqlSyntaxError(f"invalid number {text[i : end + 1]!r}", text, i)
            out.append(_Token("num", literal, i, value))
            i = end
            continue
        if c == "@":
            m = _IDENT.match(text, i + 1)
            if m is None:
                raise SqlSyntaxError("a parameter name is expected after '@'", text, i)
            out.append(_Token("param", text[i : m.end()], i, text[i : m.end()]))
            i = m.end()
            continue
        if c.isalpha() or c == "_":
            m = _IDENT.match(text, i)
            assert m is not None
            word = m.group(0)
            kind = "kw" if word.lower() in _KEYWORDS else "ident"
            out.append(_Token(kind, word, i, word.lower() if kind == "kw" else word))
            i = m.end()
            continue
        for op in _OPS:
            if text.startswith(op, i):
                out.append(_Token("op", op, i, op))
                i += len(op)
                break
        else:
            raise SqlSyntaxError(f"unexpected character {c!r}", text, i)
    out.append(_Token("end", "", n))
    return out


# ----------------------------------------------------------------------------------------------------------
# AST: every node is a callable (view, parameters) -> value; None is SQL's unknown / null.

_Node = Callable[[MessageView, Mapping[str, Any]], Any]


class _Unknown:
    """Three-valued logic: the result of a predicate that is neither true nor false."""

    __repr__ = lambda self: "UNKNOWN"  # noqa: E731


UNKNOWN = _Unknown()


def _truth(value: Any) -> bool | _Unknown:
    if value is True or value is False:
        return bool(value)
    return UNKNOWN


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _comparable(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return True
    return type(a) is type(b) or (isinstance(a, str) and isinstance(b, str))


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: bool(a == b),
    "<>": lambda a, b: bool(a != b),
    "!=": lambda a, b: bool(a != b),
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
}


def _normalize(v: Any) -> Any:
    """Values as filters compare them: UUIDs as text, datetimes aware."""
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, datetime) and v.tzinfo is None:
        return v.replace(tzinfo=timezone.utc)
    return v


def _compare(op: str, a: Any, b: Any) -> Any:
    a, b = _normalize(a), _normalize(b)
    if a is None or b is None or a is UNKNOWN or b is UNKNOWN:
        return UNKNOWN
    if not _comparable(a, b):
        return UNKNOWN
    try:
        return _COMPARE[op](a, b)
    except TypeError:
        return UNKNOWN


def _arith(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    if op == "+" and isinstance(a, str) and isinstance(b, str):
        return a + b
    if not (_is_number(a) and _is_number(b)):
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        raise FilterEvaluationError("division by zero")
    if op == "/":
        if isinstance(a, int) and isinstance(b, int):
            return int(a / b)  # integer division truncates toward zero
        return a / b
    if isinstance(a, int) and isinstance(b, int):
        return int(math.fmod(a, b))
    return math.fmod(a, b)


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# ----------------------------------------------------------------------------------------------------------
# parser (precedence climbing)


@dataclass(frozen=True)
class _Property:
    scope: str  # sys | user
    name: str


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        #: Inside parentheses a plain expression may stand where a condition would (``(a + 1) * 2``).
        self.allow_expr = False

    # -- helpers
    @property
    def tok(self) -> _Token:
        return self.toks[self.i]

    def peek(self) -> _Token:
        """The token after the current one (the end token at the end)."""
        return self.toks[min(self.i + 1, len(self.toks) - 1)]

    def next(self) -> _Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def at_kw(self, *words: str) -> bool:
        return self.tok.kind == "kw" and self.tok.value in words

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.value in ops

    def expect_op(self, op: str) -> None:
        if not self.at_op(op):
            self.fail(f"'{op}' expected")
        self.next()

    def fail(self, message: str, tok: _Token | None = None) -> None:
        t = tok or self.tok
        found = "end of expression" if t.kind == "end" else repr(t.text)
        raise SqlSyntaxError(f"{message}, found {found}", self.text, t.pos)

    # -- grammar
    def predicate(self) -> _Node:
        left = self.conjunction()
        while self.at_kw("or"):
            self.next()
            right = self.conjunction()
            left = _or(left, right)
        return left

    def conjunction(self) -> _Node:
        left = self.negation()
        while self.at_kw("and"):
            self.next()
            right = self.negation()
            left = _and(left, right)
        return left

    def negation(self) -> _Node:
        if self.at_kw("not"):
            self.next()
            inner = self.negation()
            return _not(inner)
        return self.comparison()

    def comparison(self) -> _Node:
        if self.at_kw("exists"):
            self.next()
            self.expect_op("(")
            prop = self.property_ref()
            self.expect_op(")")
            return _pred(lambda v, p: v.get(prop.scope, prop.name)[0])
        start = self.tok
        left = self.additive()
        if self.at_op("=", "<>", "!=", "<", "<=", ">", ">="):
            op = self.next().value
            right = self.additive()
            return _pred(lambda v, p: _compare(op, left(v, p), right(v, p)))
        if self.at_kw("is"):
            self.next()
            negate = False
            if self.at_kw("not"):
                self.next()
                negate = True
            if not self.at_kw("null"):
                self.fail("NULL expected")
            self.next()
            return _pred(lambda v, p: (left(v, p) is None) != negate)
        negate = False
        following = self.peek()
        if self.at_kw("not") and following.kind == "kw" and following.value in ("in", "like"):
            self.next()
            negate = True
        if self.at_kw("in"):
            self.next()
            self.expect_op("(")
            items = [self.additive()]
            while self.at_op(","):
                self.next()
                items.append(self.additive())
            self.expect_op(")")
            return _in(left, items, negate)
        if self.at_kw("like"):
            self.next()
            pattern = self.additive()
            escape: _Node | None = None
            if self.at_kw("escape"):
                self.next()
                esc_tok = self.tok
                escape = self.additive()
                if esc_tok.kind == "str" and len(esc_tok.value) != 1:
                    self.fail("the ESCAPE character must be one character", esc_tok)
            return _like(left, pattern, escape, negate)
        if getattr(left, "is_predicate", False) or self.allow_expr:
            return left
        self.fail(
            "a comparison, IN, LIKE, IS NULL or EXISTS is expected after the expression",
            self.tok if self.tok.kind != "end" else start,
        )
        raise AssertionError  # pragma: no cover

    def additive(self) -> _Node:
        left = self.multiplicative()
        while self.at_op("+", "-"):
            op = self.next().value
            right = self.multiplicative()
            left = _binary(op, left, right)
        return left

    def multiplicative(self) -> _Node:
        left = self.unary()
        while self.at_op("*", "/", "%"):
            op = self.next().value
            right = self.unary()
            left = _binary(op, left, right)
        return left

    def unary(self) -> _Node:
        if self.at_op("-", "+"):
            op = self.next().value
            inner = self.unary()
            if op == "+":
                return inner
            return lambda v, p: _arith("-", 0, inner(v, p))
        return self.primary()

    def primary(self) -> _Node:
        t = self.tok
        if t.kind in ("num", "str"):
            self.next()
            value = t.value
            return lambda v, p: value
        if t.kind == "kw" and t.value in ("true", "false"):
            self.next()
            truth = t.value == "true"
            return _pred(lambda v, p: truth)
        if t.kind == "kw" and t.value == "null":
            self.next()
            return lambda v, p: None
        if t.kind == "param":
            self.next()
            name = t.value

            def param(v: MessageView, p: Mapping[str, Any]) -> Any:
                if name in p:
                    return p[name]
                for k, val in p.items():
                    if k.lower() == name.lower():
                        return val
                raise FilterEvaluationError(f"parameter {name} has no value")

            return param
        if t.kind == "op" and t.value == "(":
            self.next()
            saved, self.allow_expr = self.allow_expr, True
            inner = self.predicate()
            self.allow_expr = saved
            self.expect_op(")")
            return inner
        if t.kind == "ident" and self.peek().kind == "op" and self.peek().value == "(":
            return self.function()
        if t.kind in ("ident", "delim"):
            prop = self.property_ref()
            return lambda v, p: v.get(prop.scope, prop.name)[1]
        self.fail("an expression is expected")
        raise AssertionError  # pragma: no cover

    def function(self) -> _Node:
        name_tok = self.next()
        name = name_tok.text.lower()
        self.expect_op("(")
        if name == "newid":
            self.expect_op(")")
            return lambda v, p: str(uuid.uuid4())
        if name == "property":
            arg = self.additive()
            self.expect_op(")")

            def prop_fn(v: MessageView, p: Mapping[str, Any]) -> Any:
                n = arg(v, p)
                if not isinstance(n, str):
                    return None
                scope, _, rest = n.partition(".")
                if rest and scope.lower() in ("sys", "user"):
                    return v.get(scope.lower(), rest)[1]
                return v.get("user", n)[1]

            return prop_fn
        self.fail(f"unknown function {name_tok.text!r}", name_tok)
        raise AssertionError  # pragma: no cover

    def property_ref(self) -> _Property:
        t = self.tok
        if t.kind not in ("ident", "delim"):
            self.fail("a property name is expected")
        self.next()
        if t.kind == "ident" and t.value.lower() in ("sys", "user") and self.at_op("."):
            self.next()
            n = self.tok
            if n.kind not in ("ident", "delim", "kw"):
                self.fail("a property name is expected after the scope")
            self.next()
            name = n.value if n.kind == "delim" else n.text
            scope = t.value.lower()
            if scope == "sys" and name.lower() not in SYSTEM_PROPERTIES:
                raise SqlSyntaxError(f"unknown system property 'sys.{name}'", self.text, n.pos)
            return _Property(scope, name)
        return _Property("user", t.value)

    # -- actions
    def action(self) -> list[tuple[str, _Property, _Node | None]]:
        statements: list[tuple[str, _Property, _Node | None]] = []
        while self.tok.kind != "end":
            if self.at_op(";"):
                self.next()
                continue
            if self.at_kw("set"):
                self.next()
                prop = self.property_ref()
                self.expect_op("=")
                statements.append(("set", prop, self.additive()))
            elif self.at_kw("remove"):
                self.next()
                statements.append(("remove", self.property_ref(), None))
            else:
                self.fail("SET or REMOVE expected")
            if not (self.at_op(";") or self.tok.kind == "end"):
                self.fail("';' or end of action expected")
        if not statements:
            self.fail("an action needs at least one SET or REMOVE")
        return statements


def _pred(node: _Node) -> _Node:
    """Mark a node as a predicate (it may stand alone where a condition is expected)."""
    node.is_predicate = True  # type: ignore[attr-defined]
    return node


def _binary(op: str, left: _Node, right: _Node) -> _Node:
    return lambda v, p: _arith(op, left(v, p), right(v, p))


def _and(left: _Node, right: _Node) -> _Node:
    @_pred
    def node(v: MessageView, p: Mapping[str, Any]) -> Any:
        a = _truth(left(v, p))
        if a is False:
            return False
        b = _truth(right(v, p))
        if b is False:
            return False
        return True if (a is True and b is True) else UNKNOWN

    return node


def _or(left: _Node, right: _Node) -> _Node:
    @_pred
    def node(v: MessageView, p: Mapping[str, Any]) -> Any:
        a = _truth(left(v, p))
        if a is True:
            return True
        b = _truth(right(v, p))
        if b is True:
            return True
        return False if (a is False and b is False) else UNKNOWN

    return node


def _not(inner: _Node) -> _Node:
    @_pred
    def node(v: MessageView, p: Mapping[str, Any]) -> Any:
        a = _truth(inner(v, p))
        return UNKNOWN if a is UNKNOWN else not a

    return node


def _in(left: _Node, items: list[_Node], negate: bool) -> _Node:
    @_pred
    def node(v: MessageView, p: Mapping[str, Any]) -> Any:
        value = _normalize(left(v, p))
        if value is None:
            return UNKNOWN
        found = any(_compare("=", value, item(v, p)) is True for item in items)
        return found != negate

    return node


def _like(left: _Node, pattern: _Node, escape: _Node | None, negate: bool) -> _Node:
    cache: dict[tuple[str, str | None], re.Pattern[str]] = {}

    @_pred
    def node(v: MessageView, p: Mapping[str, Any]) -> Any:
        value, pat = left(v, p), pattern(v, p)
        esc = escape(v, p) if escape is not None else None
        if not isinstance(value, str) or not isinstance(pat, str):
            return UNKNOWN
        if esc is not None and (not isinstance(esc, str) or len(esc) != 1):
            raise FilterEvaluationError("the ESCAPE character must be one character")
        key = (pat, esc)
        rx = cache.get(key)
        if rx is None:
            rx = cache[key] = _like_regex(pat, esc)
        return (rx.fullmatch(value) is not None) != negate

    return node


# ----------------------------------------------------------------------------------------------------------
# filters, actions, rules


class RuleFilter(Protocol):
    def matches(self, view: MessageView) -> bool: ...


@dataclass(frozen=True)
class SqlFilter:
    """A SQL filter; parsed (and refused with :class:`SqlSyntaxError`) at construction."""

    expression: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    _node: _Node = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parser = _Parser(self.expression)
        if parser.tok.kind == "end":
            parser.fail("an empty filter")
        node = parser.predicate()
        if parser.tok.kind != "end":
            parser.fail("end of filter expected")
        object.__setattr__(self, "_node", node)

    def matches(self, view: MessageView) -> bool:
        return _truth(self._node(view, self.parameters)) is True


@dataclass(frozen=True)
class TrueFilter(SqlFilter):
    expression: str = "1=1"


@dataclass(frozen=True)
class FalseFilter(SqlFilter):
    expression: str = "1>1"


#: CorrelationFilter fields -> sys property.
CORRELATION_FIELDS = {
    "correlation_id": "CorrelationId",
    "message_id": "MessageId",
    "to": "To",
    "reply_to": "ReplyTo",
    "label": "Label",
    "session_id": "SessionId",
    "reply_to_session_id": "ReplyToSessionId",
    "content_type": "ContentType",
}


@dataclass(frozen=True)
class CorrelationFilter:
    """Matches when every set field equals the message's (strings compared exactly) and every property equals
    the application property of that name."""

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    label: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)

    def matches(self, view: MessageView) -> bool:
        for attr, sys_name in CORRELATION_FIELDS.items():
            wanted = getattr(self, attr)
            if wanted is None:
                continue
            actual = _normalize(view.system.get(sys_name))
            if actual is None or str(actual) != wanted:
                return False
        for key, wanted in self.properties.items():
            present, actual = view.get("user", key)
            if not present or _compare("=", actual, wanted) is not True:
                return False
        return True


@dataclass(frozen=True)
class SqlAction:
    """``SET name = expression`` / ``REMOVE name`` statements (separated by ``;``), applied to a copy."""

    expression: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    _statements: list[tuple[str, _Property, _Node | None]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_statements", _Parser(self.expression).action())

    def apply(self, view: MessageView) -> MessageView:
        """A new view with the statements applied (``view`` is left unchanged)."""
        out = MessageView(dict(view.system), dict(view.user))
        for verb, prop, node in self._statements:
            if prop.scope == "sys":
                name = SYSTEM_PROPERTIES[prop.name.lower()]
                target = out.system
            else:
                name, target = prop.name, out.user
            if verb == "remove":
                target.pop(name, None)
            else:
                assert node is not None
                target[name] = node(out, self.parameters)
        return out


Filter = SqlFilter | CorrelationFilter


@dataclass(frozen=True)
class Rule:
    """A subscription rule: a filter and an optional action."""

    name: str
    filter: Filter = field(default_factory=TrueFilter)
    action: SqlAction | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def default_rule(created_at: datetime | None = None) -> Rule:
    """``$Default``: a true filter, no action."""
    return Rule(DEFAULT_RULE_NAME, TrueFilter(), None, created_at or datetime.now(timezone.utc))


def parse_filter(expression: str, parameters: Mapping[str, Any] | None = None) -> SqlFilter:
    """A SQL filter; ``1=1`` / ``1>1`` give :class:`TrueFilter` / :class:`FalseFilter`."""
    params = dict(parameters or {})
    stripped = expression.strip()
    if stripped == "1=1" and not params:
        return TrueFilter()
    if stripped == "1>1" and not params:
        return FalseFilter()
    return SqlFilter(expression, params)


def parse_action(expression: str, parameters: Mapping[str, Any] | None = None) -> SqlAction:
    return SqlAction(expression, dict(parameters or {}))


def route(rules: Mapping[str, Rule] | Iterator[Rule], view: MessageView) -> list[MessageView]:
    """The copies a subscription with ``rules`` receives of a message: one for all matching rules without an
    action, one per matching rule with an action (its action applied). Raises :class:`FilterEvaluationError`."""
    plain = False
    copies: list[MessageView] = []
    items = rules.values() if isinstance(rules, Mapping) else rules
    for rule in items:
        if not rule.filter.matches(view):
            continue
        if rule.action is None:
            if not plain:
                plain = True
                copies.insert(0, view)
        else:
            copy = rule.action.apply(view)
            copy.user["RuleName"] = rule.name  # as the service marks a copy made by a rule with an action
            copies.append(copy)
    return copies
