"""``shoal ctl``'s policy verbs: set_policy, clear_policy, list_policies and their operator_policy
twins (rabbitmqctl's arguments and columns)."""

from __future__ import annotations

import json
from typing import Any

import click

from cli.ctl_group import EX_DATAERR, EX_SOFTWARE, Options, emit, error, info, request, verb

POLICY_COLUMNS = ("vhost", "name", "pattern", "apply-to", "definition", "priority")


def _policy_answer(answer: dict[str, Any]) -> dict[str, Any]:
    if "error" in answer:
        error(str(answer["error"]).rstrip("\n"), EX_SOFTWARE)
    return answer


def _set_policy(opts: Options, operator: bool, name: str, pattern: str, definition: str,
                priority: int, apply_to: str) -> None:
    kind = "operator policy" if operator else "policy"
    info(opts, f'Setting {kind} "{name}" for pattern "{pattern}" to "{definition}" with priority '
               f'"{priority}" for vhost "{opts.vhost}" ...')
    try:
        parsed = json.loads(definition)
    except ValueError as exc:
        error(f"Could not parse JSON document: {exc}", EX_DATAERR)
    _policy_answer(request(opts, {
        "command": "set_operator_policy" if operator else "set_policy", "vhost": opts.vhost,
        "name": name, "pattern": pattern, "definition": parsed, "priority": priority,
        "apply-to": apply_to}))


@verb("set_policy")
@click.option("--priority", type=int, default=0, help="Higher wins among matching policies.")
@click.option("--apply-to", "apply_to", default="all", help="queues, exchanges or all.")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_policy(opts: Options, priority: int, apply_to: str, name: str, pattern: str,
               definition: str) -> None:
    """Set a policy: DEFINITION (JSON) for the queues and exchanges whose name PATTERN matches."""
    _set_policy(opts, False, name, pattern, definition, priority, apply_to)


@verb("set_operator_policy")
@click.option("--priority", type=int, default=0, help="Higher wins among matching policies.")
@click.option("--apply-to", "apply_to", default="all", help="queues, exchanges or all.")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_operator_policy(opts: Options, priority: int, apply_to: str, name: str, pattern: str,
                        definition: str) -> None:
    """Set an operator policy: caps on the numeric limits (the smaller value wins)."""
    _set_policy(opts, True, name, pattern, definition, priority, apply_to)


@verb("clear_policy")
@click.argument("name")
def clear_policy(opts: Options, name: str) -> None:
    """Remove a policy: its queues and exchanges go back to their own arguments."""
    info(opts, f'Clearing policy "{name}" on vhost "{opts.vhost}" ...')
    _policy_answer(request(opts, {"command": "clear_policy", "vhost": opts.vhost, "name": name}))


@verb("clear_operator_policy")
@click.argument("name")
def clear_operator_policy(opts: Options, name: str) -> None:
    """Remove an operator policy."""
    info(opts, f'Clearing operator policy "{name}" on vhost "{opts.vhost}" ...')
    _policy_answer(request(opts, {"command": "clear_operator_policy", "vhost": opts.vhost,
                                  "name": name}))


def _list_policies(opts: Options, operator: bool) -> None:
    info(opts, f'Listing {"operator policy overrides" if operator else "policies"} for vhost '
               f'"{opts.vhost}" ...')
    answer = _policy_answer(request(opts, {
        "command": "list_operator_policies" if operator else "list_policies", "vhost": opts.vhost}))
    emit(opts, POLICY_COLUMNS, list(answer.get("policies", [])))


@verb("list_policies")
def list_policies(opts: Options) -> None:
    """The policies: vhost name pattern apply-to definition priority."""
    _list_policies(opts, False)


@verb("list_operator_policies")
def list_operator_policies(opts: Options) -> None:
    """The operator policies: vhost name pattern apply-to definition priority."""
    _list_policies(opts, True)
