"""Whether AWS would allow a request, by the principal's identity-based policies and its
permissions boundary: an IAM policy evaluator for the tests, written from AWS's documentation
(the IAM User Guide; each subtle rule names the page it comes from). Same-account requests
only: no resource-based policies, SCPs or session policies.

    Request      the action ("s3:GetObject"), the resource's ARN and the request context (its
                 condition keys: "aws:PrincipalAccount", "aws:PrincipalTag/job", "s3:prefix",
                 ...; a list is a multivalued key, None an absent one)
    evaluate     evaluate(identity, request, boundary=None): "allow", "explicit-deny" or
                 "implicit-deny"; `identity` is the principal's identity-based policy documents
                 (inline and managed alike), `boundary` its permissions boundary's document
    allowed      evaluate(...) == "allow"
    PolicyError  a document (or request context) the evaluator cannot evaluate faithfully: an
                 unknown element, operator or value, or a case the documentation leaves open.
                 Raised, never guessed: a test never passes on an allow or deny AWS might not
                 give.

Every document is parsed and checked before any statement is evaluated, so a bad document
raises whatever the request; what depends on the request (its context's values) is checked
in the statements that apply to its action and resource.
"""

from __future__ import annotations

import ipaddress
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any

ALLOW, EXPLICIT_DENY, IMPLICIT_DENY = "allow", "explicit-deny", "implicit-deny"

ContextValue = str | int | bool | Sequence[str] | None
Context = dict[str, Any]  # the request context, its key names lower-cased; absent keys left out
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class PolicyError(ValueError):
    """A document or request context the evaluator cannot evaluate faithfully."""


@dataclass(frozen=True)
class Request:
    action: str  # "s3:GetObject": service prefix and action, matched case-insensitively
    resource: str  # the resource's ARN, matched case-sensitively
    # The request context: condition key -> value. Key names are compared case-insensitively
    # ("Context key names are not case-sensitive", IAM JSON policy elements: Condition); a
    # list is a multivalued key (aws:TagKeys), None the same as leaving the key out.
    context: Mapping[str, ContextValue] = field(default_factory=dict)


def evaluate(identity: Sequence[Mapping], request: Request,
             boundary: Mapping | None = None) -> str:
    """The decision on `request` ("allow", "explicit-deny" or "implicit-deny") for a principal
    with the identity-based policy documents `identity` and the permissions boundary
    `boundary`.

    Policy evaluation logic / Permissions boundaries for IAM entities: an explicit Deny in any
    of the policies wins; otherwise the request is allowed only if an identity-based policy
    allows it and, where the entity has a boundary, the boundary allows it too ("The
    effective permissions are everything that is allowed by both policy types. An explicit
    deny in either of these policies overrides the allow."); else it is implicitly denied."""
    if isinstance(identity, Mapping):
        raise PolicyError("identity is a list of policy documents, not one document")
    statements = [s for document in identity for s in _statements(document)]
    limits = None if boundary is None else _statements(boundary)
    context = _context(request.context)
    effects = _effects(statements, request, context)
    bounded = None if limits is None else _effects(limits, request, context)
    if "Deny" in effects or (bounded is not None and "Deny" in bounded):
        return EXPLICIT_DENY
    if "Allow" in effects and (bounded is None or "Allow" in bounded):
        return ALLOW
    return IMPLICIT_DENY


def allowed(identity: Sequence[Mapping], request: Request,
            boundary: Mapping | None = None) -> bool:
    """Whether AWS allows `request` (see `evaluate`)."""
    return evaluate(identity, request, boundary) == ALLOW


# --- Patterns: wildcards and policy variables ---------------------------------------------


class _Wild(Enum):
    """A wildcard in a pattern: `*` any run of characters (`/` and `:` included), `?` one."""
    ANY = "*"
    ONE = "?"


Tokens = tuple[str | _Wild, ...]  # a pattern: literal text and wildcards


@dataclass(frozen=True)
class _Literal:
    """Text no wildcard is read in: ${*}, ${?} and ${$} (IAM policy elements: Variables and
    tags, "Special characters")."""
    text: str


@dataclass(frozen=True)
class _Variable:
    """${key} or ${key, 'default'}: the request context's value of `key`."""
    key: str  # lower-cased: key names are case-insensitive
    default: str | None


Piece = str | _Literal | _Variable  # a str is the policy's own text, wildcards and all
Pieces = tuple[Piece, ...]

_VARIABLE = re.compile(r"\$\{([^}]*)\}")
# "surround the default value with single quotes ('), and separate the variable text and the
# default value with a comma and space (, )" (IAM policy elements: Variables and tags).
_NAMED = re.compile(r"\s*([^\s,']+)\s*(?:,\s*'([^']*)'\s*)?")


def _pieces(text: str, variables: bool) -> Pieces:
    """`text` from a policy, its ${...} read as policy variables where `variables` (documents
    of Version 2012-10-17). IAM policy elements: Variables and tags: "If you don't include
    the Version element and set it to an appropriate version date, variables like
    ${aws:username} are treated as literal strings in the policy"."""
    if not variables:
        return (text,)
    pieces: list[Piece] = []
    at = 0
    for found in _VARIABLE.finditer(text):
        pieces.append(text[at:found.start()])
        pieces.append(_variable(found.group(1), text))
        at = found.end()
    rest = text[at:]
    if "${" in rest:
        raise PolicyError(f"an unterminated policy variable in {text!r}")
    pieces.append(rest)
    return tuple(piece for piece in pieces if piece != "")


def _variable(inner: str, text: str) -> _Literal | _Variable:
    if inner in ("*", "?", "$"):
        return _Literal(inner)
    named = _NAMED.fullmatch(inner)
    if not named:
        raise PolicyError(f"a policy variable IAM does not define: ${{{inner}}} in {text!r}")
    return _Variable(named.group(1).lower(), named.group(2))


def _wildcards(text: str) -> Tokens:
    return tuple(_Wild(part) if part in ("*", "?") else part
                 for part in re.split(r"([*?])", text) if part)


def _resolve(pieces: Pieces, context: Context) -> Tokens | None:
    """The pattern `pieces` stand for in this request, or None where a variable has no value
    and no default: IAM policy elements: Variables and tags ("Policy variables with no value")
    says such a value is effectively null, so it matches nothing: a Resource holding it
    matches no resource, StringEquals and StringLike do not match it and the negated
    operators (StringNotEquals, ...) do. A value from the context is literal text."""
    tokens: list[str | _Wild] = []
    for piece in pieces:
        if isinstance(piece, _Variable):
            value = _variable_value(piece, context)
            if value is None:
                return None
            tokens.append(value)
        elif isinstance(piece, _Literal):
            tokens.append(piece.text)
        else:
            tokens.extend(_wildcards(piece))
    return tuple(tokens)


def _variable_value(variable: _Variable, context: Context) -> str | None:
    if variable.key not in context:
        return variable.default
    value = context[variable.key]
    if isinstance(value, list):
        # Single-valued vs. multivalued context keys: "you can't use multivalued context keys
        # as policy variables".
        raise PolicyError(f"the multivalued key {variable.key} is used as a policy variable")
    return _text(value)


def _plain(tokens: Tokens) -> str:
    """The pattern as text, its wildcards as the characters (StringEquals has no wildcards)."""
    return "".join(t.value if isinstance(t, _Wild) else t for t in tokens)


def _regex(tokens: Tokens, ignore_case: bool = False) -> re.Pattern[str]:
    body = "".join(".*" if t is _Wild.ANY else "." if t is _Wild.ONE else re.escape(t)
                   for t in tokens)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _arn_parts(tokens: Tokens) -> list[Tokens]:
    """The six colon-separated parts of an ARN pattern; the last (the resource) keeps its
    own colons, as an ARN's does."""
    parts: list[list[str | _Wild]] = [[]]
    for token in tokens:
        if isinstance(token, _Wild) or len(parts) == 6:
            parts[-1].append(token)
            continue
        head, *rest = token.split(":", 6 - len(parts))
        parts[-1].append(head)
        parts.extend([part] for part in rest)
    if len(parts) != 6:
        raise PolicyError(f"not an ARN (six colon-separated parts): {_plain(tokens)!r}")
    return [tuple(part) for part in parts]


# --- Values --------------------------------------------------------------------------------


def _text(value: object) -> str:
    """A policy's or context's scalar as a string operator compares it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise PolicyError(f"not a string, number or boolean: {value!r}")


def _string(value: object, variables: bool = False) -> Pieces:
    return _pieces(_text(value), variables)


def _number(value: object, variables: bool = False) -> Decimal:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        try:
            number = Decimal(str(value).strip())
        except InvalidOperation:
            number = Decimal("NaN")
        if number.is_finite():
            return number
    # IAM JSON policy elements: Condition operators: "You can not use a policy variable with
    # the Numeric condition operator" (nor Date, IP address or Null).
    raise PolicyError(f"not a number: {value!r}")


_EPOCH = re.compile(r"-?\d+")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _date(value: object, variables: bool = False) -> datetime:
    """A date and time: one of W3C's ISO 8601 formats or epoch (UNIX) seconds (IAM JSON
    policy elements: Condition operators, "Date condition operators"). W3C's profile requires
    a time zone with a time; a date alone is taken as midnight UTC."""
    if isinstance(value, int) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, timezone.utc)
    if not isinstance(value, str):
        raise PolicyError(f"not a date: {value!r}")
    if _EPOCH.fullmatch(value):
        return datetime.fromtimestamp(int(value), timezone.utc)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise PolicyError(f"not a date: {value!r}") from None
    if moment.tzinfo is not None:
        return moment
    if _DAY.fullmatch(value):
        return moment.replace(tzinfo=timezone.utc)
    raise PolicyError(f"a time without a time zone: {value!r}")


def _boolean(value: object, variables: bool = False) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    # The Condition operators page says a variable can be used with Bool; its Variables and
    # tags page says it cannot: a variable here is refused rather than guessed at.
    raise PolicyError(f"not true or false: {value!r}")


def _network(value: object, variables: bool = False) -> Network:
    # "If you specify an IP address without the associated routing prefix, IAM uses the
    # default prefix value of /32" (IAM JSON policy elements: Condition operators).
    try:
        return ipaddress.ip_network(value, strict=False)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PolicyError(f"not an IP address or CIDR range: {value!r}") from None


def _address(value: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PolicyError(f"not an IP address: {value!r}") from None


# --- Condition operators -------------------------------------------------------------------

Match = Callable[[Any, Any, Context], bool]  # (the context's value, a policy value, context)


@dataclass(frozen=True)
class _Operator:
    parse: Callable[[object, bool], Any]  # a policy value -> what `match` compares with
    match: Match  # the positive test
    negated: bool = False  # StringNotEquals, ...: true where no listed value matches


def _string_equals(actual: object, expected: Pieces, context: Context) -> bool:
    tokens = _resolve(expected, context)
    return tokens is not None and _text(actual) == _plain(tokens)


def _string_equals_ignore_case(actual: object, expected: Pieces, context: Context) -> bool:
    tokens = _resolve(expected, context)
    return tokens is not None and _text(actual).casefold() == _plain(tokens).casefold()


def _string_like(actual: object, expected: Pieces, context: Context) -> bool:
    tokens = _resolve(expected, context)
    return tokens is not None and bool(_regex(tokens).fullmatch(_text(actual)))


def _arn_like(actual: object, expected: Pieces, context: Context) -> bool:
    """IAM JSON policy elements: Condition operators, "ARN condition operators": "Each of
    the six colon-delimited components of the ARN is checked separately and each can
    include" wildcards; case-sensitive. ArnEquals and ArnLike behave identically."""
    tokens = _resolve(expected, context)
    if tokens is None:
        return False
    wanted, got = _arn_parts(tokens), _text(actual).split(":", 5)
    return len(got) == 6 and all(_regex(w).fullmatch(g) for w, g in zip(wanted, got))


def _ordered(parse: Callable[[object, bool], Any], relation: Callable[[Any, Any], bool]) -> Match:
    return lambda actual, expected, context: relation(parse(actual, False), expected)


def _bool_equals(actual: object, expected: bool, context: Context) -> bool:
    return _boolean(actual) == expected


def _in_network(actual: object, expected: Any, context: Context) -> bool:
    return _address(actual) in expected


_OPERATORS: dict[str, _Operator] = {
    "StringEquals": _Operator(_string, _string_equals),
    "StringNotEquals": _Operator(_string, _string_equals, negated=True),
    "StringEqualsIgnoreCase": _Operator(_string, _string_equals_ignore_case),
    "StringNotEqualsIgnoreCase": _Operator(_string, _string_equals_ignore_case, negated=True),
    "StringLike": _Operator(_string, _string_like),
    "StringNotLike": _Operator(_string, _string_like, negated=True),
    "NumericEquals": _Operator(_number, _ordered(_number, operator.eq)),
    "NumericNotEquals": _Operator(_number, _ordered(_number, operator.eq), negated=True),
    "NumericLessThan": _Operator(_number, _ordered(_number, operator.lt)),
    "NumericLessThanEquals": _Operator(_number, _ordered(_number, operator.le)),
    "NumericGreaterThan": _Operator(_number, _ordered(_number, operator.gt)),
    "NumericGreaterThanEquals": _Operator(_number, _ordered(_number, operator.ge)),
    "DateEquals": _Operator(_date, _ordered(_date, operator.eq)),
    "DateNotEquals": _Operator(_date, _ordered(_date, operator.eq), negated=True),
    "DateLessThan": _Operator(_date, _ordered(_date, operator.lt)),
    "DateLessThanEquals": _Operator(_date, _ordered(_date, operator.le)),
    "DateGreaterThan": _Operator(_date, _ordered(_date, operator.gt)),
    "DateGreaterThanEquals": _Operator(_date, _ordered(_date, operator.ge)),
    "Bool": _Operator(_boolean, _bool_equals),
    "IpAddress": _Operator(_network, _in_network),
    "NotIpAddress": _Operator(_network, _in_network, negated=True),
    "ArnEquals": _Operator(_string, _arn_like),
    "ArnLike": _Operator(_string, _arn_like),
    "ArnNotEquals": _Operator(_string, _arn_like, negated=True),
    "ArnNotLike": _Operator(_string, _arn_like, negated=True),
}
_NULL = _Operator(_boolean, _bool_equals)  # tests presence; see _holds


@dataclass(frozen=True)
class _Condition:
    name: str  # the operator as the policy writes it, for messages
    key: str  # the context key, lower-cased
    operator: _Operator
    expected: tuple[Any, ...]  # the policy's values, parsed
    qualifier: str  # "", "ForAllValues" or "ForAnyValue"
    if_exists: bool


def _operator(name: str) -> tuple[str, _Operator, bool]:
    """(qualifier, operator, if_exists) of an operator's name, e.g.
    "ForAnyValue:StringLikeIfExists"."""
    qualifier, _, base = name.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    if qualifier not in ("", "ForAllValues", "ForAnyValue"):
        raise PolicyError(f"an unknown set operator: {name}")
    if base == "Null":
        # "You can add IfExists to the end of any condition operator name except the Null
        # condition" (IAM JSON policy elements: Condition operators).
        if qualifier or if_exists:
            raise PolicyError(f"Null takes neither IfExists nor a set operator: {name}")
        return qualifier, _NULL, False
    if base not in _OPERATORS:
        raise PolicyError(f"an unknown condition operator: {name}")
    if qualifier == "ForAnyValue" and if_exists:
        # The docs say IfExists makes an absent key true, and ForAnyValue makes it false;
        # they do not say which wins. (ForAllValues with IfExists: true either way.)
        raise PolicyError(f"the docs do not say how {name} treats an absent key")
    return qualifier, _OPERATORS[base], if_exists


def _conditions(block: object, variables: bool) -> tuple[_Condition, ...]:
    if not isinstance(block, Mapping):
        raise PolicyError(f"a Condition is a map of operators: {block!r}")
    conditions = []
    for name, keys in block.items():
        qualifier, op, if_exists = _operator(name)
        if not isinstance(keys, Mapping) or not keys:
            raise PolicyError(f"{name} needs a map of condition keys to values: {keys!r}")
        for key, values in keys.items():
            listed = values if isinstance(values, list) else [values]
            if not listed:
                raise PolicyError(f"{name} lists no values for {key}")
            expected = tuple(op.parse(value, variables) for value in listed)
            conditions.append(_Condition(name, key.lower(), op, expected, qualifier, if_exists))
    return tuple(conditions)


def _holds(condition: _Condition, context: Context) -> bool:
    """IAM JSON policy elements: Condition operators: "If the key that you specify in a policy
    condition is not present in the request context, the values do not match and the
    condition is false. If the policy condition requires that the key is not matched, such as
    StringNotLike or ArnNotLike, and the right key is not present, the condition is true. This
    logic applies to all condition operators except ...IfExists and Null check." IfExists: "If
    the key is not present, evaluate the condition element as true." Null: "true (the key
    doesn't exist — it is null) or false (the key exists and its value is not null)"."""
    present = condition.key in context
    if condition.operator is _NULL:
        return any(expected == (not present) for expected in condition.expected)
    if condition.qualifier:
        return _holds_for_set(condition, context)
    if not present:
        return condition.if_exists or condition.operator.negated
    actual = context[condition.key]
    if isinstance(actual, list):
        # Single-valued vs. multivalued context keys: "Multivalued context keys require a
        # condition set operator"; how a plain operator reads several values is not said.
        raise PolicyError(f"{condition.name} on the multivalued key {condition.key} needs "
                          "ForAllValues or ForAnyValue")
    return _matches(condition, actual, context)


def _holds_for_set(condition: _Condition, context: Context) -> bool:
    """Single-valued vs. multivalued context keys: ForAllValues is true where every value in
    the request matches, and "if there are no context keys in the request or if the context
    key value resolves to a null dataset, such as an empty string"; ForAnyValue is true where
    one value matches, and false for an absent key or an empty set. A single-valued key is a
    set of one (AWS advises against set operators on such keys, but they are evaluated)."""
    value = context.get(condition.key, [])
    members = value if isinstance(value, list) else [] if value == "" else [value]
    results = [_matches(condition, member, context) for member in members]
    return all(results) if condition.qualifier == "ForAllValues" else any(results)


def _matches(condition: _Condition, actual: object, context: Context) -> bool:
    """One value of the context against the condition's values: true where any listed value
    matches, and for a negated operator where none does (Conditions with multiple context
    keys or values: "If a single negated matching condition operator includes multiple
    values for a context key, those values are evaluated using a logical NOR")."""
    hit = any([condition.operator.match(actual, expected, context)
               for expected in condition.expected])
    return hit != condition.operator.negated


# --- Documents and statements --------------------------------------------------------------

_DOCUMENT_ELEMENTS = {"Version", "Id", "Statement"}
_STATEMENT_ELEMENTS = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource",
                       "Condition"}
_VERSIONS = (None, "2008-10-17", "2012-10-17")


@dataclass(frozen=True)
class _Statement:
    effect: str  # "Allow" or "Deny"
    actions: tuple[Tokens, ...]
    not_action: bool  # the actions are NotAction's: the statement covers every other action
    resources: tuple[Pieces, ...]
    not_resource: bool
    conditions: tuple[_Condition, ...]

    def applies(self, request: Request, context: Context) -> bool:
        """Whether the statement covers the request: its action, its resource and all its
        conditions (IAM JSON policy elements: Condition: operators and keys are AND'ed)."""
        action = any(_regex(a, ignore_case=True).fullmatch(request.action)
                     for a in self.actions)
        resource = any(_resource_matches(r, request.resource, context) for r in self.resources)
        if action == self.not_action or resource == self.not_resource:
            return False
        return all([_holds(condition, context) for condition in self.conditions])


def _resource_matches(pieces: Pieces, resource: str, context: Context) -> bool:
    tokens = _resolve(pieces, context)
    return tokens is not None and bool(_regex(tokens).fullmatch(resource))


def _statements(document: object) -> list[_Statement]:
    if not isinstance(document, Mapping):
        raise PolicyError(f"a policy document is a JSON object: {document!r}")
    unknown = set(document) - _DOCUMENT_ELEMENTS
    if unknown:
        raise PolicyError(f"unknown policy elements: {sorted(unknown)}")
    if document.get("Version") not in _VERSIONS:
        raise PolicyError(f"an unknown policy language Version: {document.get('Version')!r}")
    if "Statement" not in document:
        raise PolicyError("a policy document without a Statement")
    body = document["Statement"]
    listed = [body] if isinstance(body, Mapping) else body
    if not isinstance(listed, list):
        raise PolicyError(f"Statement is a statement or a list of them: {body!r}")
    variables = document.get("Version") == "2012-10-17"
    return [_statement(raw, variables) for raw in listed]


def _statement(raw: object, variables: bool) -> _Statement:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"a statement is a JSON object: {raw!r}")
    unknown = set(raw) - _STATEMENT_ELEMENTS
    if unknown:  # Principal and NotPrincipal belong to resource-based policies
        raise PolicyError(f"elements an identity-based statement cannot have: {sorted(unknown)}")
    if raw.get("Effect") not in ("Allow", "Deny"):
        raise PolicyError(f"Effect is Allow or Deny, not {raw.get('Effect')!r}")
    actions, not_action = _either(raw, "Action", "NotAction")
    resources, not_resource = _either(raw, "Resource", "NotResource")
    return _Statement(
        effect=raw["Effect"],
        actions=tuple(_wildcards(action) for action in actions),
        not_action=not_action,
        resources=tuple(_resource(resource, variables) for resource in resources),
        not_resource=not_resource,
        conditions=_conditions(raw.get("Condition", {}), variables),
    )


def _either(raw: Mapping, element: str, negated: str) -> tuple[list[str], bool]:
    """The values of exactly one of `element` and `negated`, and whether it was `negated`."""
    if (element in raw) == (negated in raw):
        raise PolicyError(f"a statement has either {element} or {negated}: {dict(raw)!r}")
    name = element if element in raw else negated
    value = raw[name]
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not listed or not all(isinstance(v, str) for v in listed):
        raise PolicyError(f"{name} is a string or a non-empty list of strings: {value!r}")
    return listed, name == negated


def _resource(text: str, variables: bool) -> Pieces:
    """A Resource pattern. IAM policy elements: Variables and tags: a variable can stand "only
    in the resource portion of the ARN. This portion of the ARN appears after the fifth colon
    (:). You can't use a variable to replace parts of the ARN before the fifth colon"."""
    pieces = _pieces(text, variables)
    colons = 0
    for piece in pieces:
        if colons >= 5:
            break
        if not isinstance(piece, str):
            raise PolicyError(f"a policy variable before the resource part of {text!r}")
        colons += piece.count(":")
    return pieces


def _effects(statements: list[_Statement], request: Request, context: Context) -> set[str]:
    return {s.effect for s in statements if s.applies(request, context)}


def _context(raw: Mapping[str, ContextValue]) -> Context:
    context: Context = {}
    for key, value in raw.items():
        folded = key.lower()
        if folded in context:
            raise PolicyError(f"the request context names {key} twice (key names ignore case)")
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            if not all(isinstance(member, str) for member in value):
                raise PolicyError(f"a multivalued key holds strings: {key}={value!r}")
            value = list(value)
        elif not isinstance(value, (str, int, bool)):
            raise PolicyError(f"a context value is a string, number, boolean or list: {key}")
        context[folded] = value
    return context
