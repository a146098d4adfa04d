"""Policies: RabbitMQ's way of giving queues and exchanges arguments in bulk, by name pattern.

Theory of operation
-------------------
A policy (RabbitMQ ``rabbit_policy``) is ``{vhost, name, pattern, apply-to, definition,
priority}``. Its pattern is a regular expression *searched* in a queue's or exchange's name
(Erlang ``re:run``: unanchored); ``apply-to`` says which kind it may apply to (``queues``,
``exchanges`` or ``all``). Of the policies that match an object, exactly one applies: the one
of highest priority. RabbitMQ sorts the matching ones with ``lists:sort`` and the comparator
``priority(A) >= priority(B)`` -- a stable sort, so between equal priorities the order the
policies were listed in decides, which for RabbitMQ is its parameter table's order (not one
it documents). Shoal lists them by name, so between equal priorities the name that sorts first
wins: deterministic, and what a sorted listing shows first.

The definition's keys are validated as ``rabbit_policies:validate_policy`` does (the keys Shoal
acts on, plus ``queue-mode``, accepted and without effect as on RabbitMQ 3.12+): an invalid
value or an unknown key refuses the whole policy with RabbitMQ's texts (``Validation failed``,
then one line per problem, Erlang's ``~p`` rendering of the value).

How a policy meets a queue's own x-arguments is ``rabbit_amqqueue_process``'s
``process_args_policy``: for ``expires``, ``message-ttl``, ``max-length``, ``max-length-bytes``
(and quorum queues' ``delivery-limit``) the smaller of the two wins (``res_min``); for every
other key the queue's own argument wins (``res_arg``). An exchange's ``alternate-exchange``
argument wins over the policy's (``rabbit_policy:get_arg``). Operator policies (a second,
operator-set table) cap the user policy: for the numeric keys above the smaller wins
(``rabbit_policies:merge_policy_value``); they accept those keys only.

What changes when a policy is set or cleared (RabbitMQ ``rabbit_amqqueue:policy_changed``):
each matching queue gets its effective arguments again at once -- a new ``max-length`` drops
messages from the head (dead-lettering them where there is a dead-letter exchange), a new
``message-ttl`` applies to messages enqueued from then on (RabbitMQ computes a message's
expiry when it is enqueued), ``expires`` restarts the queue's lease, the dead-letter exchange
and routing key are those of the next dead letter; an exchange's alternate exchange changes
for the next publish. The queue's declared arguments are untouched (redeclare equivalence
compares those only, as RabbitMQ does).

Called from: the supervisor process (``broker.topology.vhost``, ``broker.runtime.policies``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

APPLY_TO = ("all", "exchanges", "queues")

# rabbit_policies:validate_policy0: the key, its check and the text of its error.
_MIN_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit")
QUEUE_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes", "overflow",
              "dead-letter-exchange", "dead-letter-routing-key", "delivery-limit", "queue-mode")
EXCHANGE_KEYS = ("alternate-exchange",)
OPERATOR_KEYS = _MIN_KEYS


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _binary(value: Any) -> bool:
    return isinstance(value, str)


def _int_at_least(n: int) -> Any:
    return lambda value: _is_int(value) and value >= n


_VALIDATORS: dict[str, tuple[Any, str]] = {
    "alternate-exchange": (_binary, "is not a valid alternate exchange name"),
    "dead-letter-exchange": (_binary, "is not a valid dead letter exchange name"),
    "dead-letter-routing-key": (_binary, "is not a valid dead letter routing key"),
    "message-ttl": (_int_at_least(0), "is not a valid message TTL"),
    "expires": (_int_at_least(1), "is not a valid queue expiry"),
    "max-length": (_int_at_least(0), "is not a valid maximum length"),
    "max-length-bytes": (_int_at_least(0), "is not a valid maximum length in bytes"),
    "queue-mode": (lambda v: v in ("default", "lazy"), "is not a valid queue-mode value"),
    "overflow": (lambda v: v in ("drop-head", "reject-publish", "reject-publish-dlx"),
                 "is not a valid overflow value"),
    "delivery-limit": (_int_at_least(0), "is not a valid delivery limit"),
    # rabbit_federation_parameters:validate_policy; the links process reads them, routing never
    "federation-upstream": (_binary, "is not a valid federation upstream name"),
    "federation-upstream-set": (_binary, "is not a valid federation upstream set name"),
}


def erl(value: Any) -> str:
    """A JSON value as Erlang's ``~p`` prints what RabbitMQ decoded it to."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(erl(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "#{" + ",".join(f"{erl(k)} => {erl(v)}" for k, v in sorted(value.items())) + "}"
    return repr(value)


class PolicyError(Exception):
    """A policy refused: ``str()`` is RabbitMQ's ``Validation failed`` text."""


@dataclass(frozen=True)
class Policy:
    """One policy (or operator policy) of one virtual host."""

    vhost: str
    name: str
    pattern: str
    apply_to: str
    definition: dict[str, Any]
    priority: int
    regex: re.Pattern[str] = field(compare=False, repr=False, default=re.compile(""))

    def applies_to(self, kind: str, name: str) -> bool:
        """Whether it matches a ``kind`` (``queue`` / ``exchange``) named ``name``."""
        if self.apply_to != "all" and self.apply_to != kind + "s":
            return False
        return self.regex.search(name) is not None

    def as_json(self) -> dict[str, Any]:
        """RabbitMQ's shape (GET /api/policies, definitions export)."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "apply-to": self.apply_to, "definition": dict(self.definition),
                "priority": self.priority}


def _definition_errors(definition: Any, operator: bool) -> list[str]:
    if not isinstance(definition, Mapping):
        return [f"definition must be a dictionary: {erl(definition)}"]
    if not definition:
        return ["no policy provided"]
    allowed = OPERATOR_KEYS if operator else tuple(_VALIDATORS)
    # maps:to_list: keys in order; validate_policy stops at the first bad value.
    items = sorted(definition.items())
    for key, value in items:
        if key in allowed:
            check, text = _VALIDATORS[key]
            if not check(value):
                return [f"{erl(value)} {text}"]
    if "federation-upstream" in definition and "federation-upstream-set" in definition:
        return ["cannot specify federation-upstream and federation-upstream-set together"]
    unknown = [(k, v) for k, v in items if k not in allowed]
    if unknown:
        listed = ",".join(f"{{{erl(k)},{erl(v)}}}" for k, v in unknown)
        return [f"[{listed}] are not recognised policy settings"]
    return []


def make_policy(vhost: str, name: str, pattern: Any, definition: Any, priority: Any = 0,
                apply_to: Any = "all", *, operator: bool = False) -> Policy:
    """Validate as ``rabbit_policy:validate`` (via ``rabbit_runtime_parameters``) and build the
    policy; PolicyError with RabbitMQ's ``Validation failed`` text otherwise."""
    if priority is None:
        priority = 0
    if apply_to is None:
        apply_to = "all"
    errors: list[str] = []
    # rabbit_parameter_validation:proplist prepends each result, so they print in reverse of
    # the constraints' order (priority, pattern, apply-to, definition).
    errors += _definition_errors(definition, operator)
    if not isinstance(apply_to, str):
        errors.append(f"apply-to '{erl(apply_to)}' unrecognised; should be one of: 'queues', "
                      "'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'")
    elif apply_to not in APPLY_TO:
        errors.append(f"apply-to '{apply_to}' unrecognised; should be one of: 'queues', "
                      "'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'")
    regex = None
    if not isinstance(pattern, str):
        errors.append(f"pattern should be a binary but was {erl(pattern)}")
    else:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            errors.append(f'pattern should be regular expression but is invalid: {{"{exc.msg}",'
                          f"{exc.pos or 0}}}")
    if isinstance(priority, str):  # the management API and rabbitmqctl send it as text too
        try:
            priority = int(priority)
        except ValueError:
            pass
    if not _is_int(priority) and not isinstance(priority, float):
        errors.append(f"priority should be a number, actually was {erl(priority)}")
    if errors:
        raise PolicyError("Validation failed\n\n" + "".join(e + "\n" for e in errors))
    assert regex is not None and isinstance(pattern, str) and isinstance(apply_to, str)
    assert isinstance(definition, Mapping)
    return Policy(vhost, name, pattern, apply_to, dict(definition), int(priority), regex)


def winner(policies: Iterable[Policy], kind: str, name: str) -> Policy | None:
    """The policy that applies to ``kind`` ``name``: highest priority, then first by name."""
    best: Policy | None = None
    for p in policies:
        if p.applies_to(kind, name) and (
                best is None or p.priority > best.priority
                or (p.priority == best.priority and p.name < best.name)):
            best = p
    return best


def merged_definition(policy: Policy | None, operator: Policy | None) -> dict[str, Any] | None:
    """``rabbit_policy:merge_operator_definitions``: the user policy's keys and the operator
    policy's, the smaller value where both set one; None when neither applies."""
    if policy is None and operator is None:
        return None
    out = dict(policy.definition) if policy is not None else {}
    if operator is not None:
        for key, value in operator.definition.items():
            mine = out.get(key)
            out[key] = value if mine is None or not _is_int(mine) else min(mine, value)
    return out


def effective_queue_arguments(arguments: Mapping[str, Any] | None,
                              definition: Mapping[str, Any] | None) -> dict[str, Any]:
    """A queue's arguments with the policy definition resolved in (``process_args_policy``):
    the smaller of the two for the numeric limits, the queue's own for the rest."""
    out = dict(arguments or {})
    if not definition:
        return out
    for key in QUEUE_KEYS:
        if key not in definition or key == "queue-mode":
            continue
        value = definition[key]
        arg = "x-" + key
        own = out.get(arg)
        if own is None:
            out[arg] = value
        elif key in _MIN_KEYS and _is_int(own) and _is_int(value):
            out[arg] = min(own, value)
    if "x-dead-letter-routing-key" in out and "x-dead-letter-exchange" not in out:
        # a policy's routing key without a dead-letter exchange anywhere: nothing to route
        del out["x-dead-letter-routing-key"]
    return out


def effective_alternate(arguments: Mapping[str, Any] | None,
                        definition: Mapping[str, Any] | None) -> str | None:
    """An exchange's alternate exchange: its own argument, else the policy's (``get_arg``)."""
    own = (arguments or {}).get("alternate-exchange")
    if isinstance(own, (bytes, bytearray)):
        own = bytes(own).decode(errors="replace")
    if isinstance(own, str):
        return own
    value = (definition or {}).get("alternate-exchange")
    return value if isinstance(value, str) else None


class PolicyTable:
    """The policies and operator policies of one virtual host, by name."""

    def __init__(self) -> None:
        self.policies: dict[str, Policy] = {}
        self.operator: dict[str, Policy] = {}

    def __bool__(self) -> bool:
        return bool(self.policies or self.operator)

    def table(self, operator: bool) -> dict[str, Policy]:
        return self.operator if operator else self.policies

    def listing(self, operator: bool = False) -> list[Policy]:
        """RabbitMQ's ``list_formatted``: highest priority first (then by name)."""
        return sorted(self.table(operator).values(), key=lambda p: (-p.priority, p.name))

    def resolve(self, kind: str, name: str) -> tuple[Policy | None, Policy | None]:
        """The policy and operator policy that apply to ``kind`` ``name``."""
        return (winner(self.policies.values(), kind, name),
                winner(self.operator.values(), kind, name))
