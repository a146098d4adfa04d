"""``shoal ctl``'s runtime parameter verbs (dynamic shovels): set_parameter, clear_parameter,
list_parameters (rabbitmqctl's arguments and columns)."""

from __future__ import annotations

import json
from typing import Any

import click

from cli.ctl_group import EX_DATAERR, EX_SOFTWARE, Options, emit, error, info, request, verb

PARAMETER_COLUMNS = ("component", "name", "value")


def _answer(answer: dict[str, Any]) -> dict[str, Any]:
    if "error" in answer:
        error(str(answer["error"]).rstrip("\n"), EX_SOFTWARE)
    return answer


@verb("set_parameter")
@click.argument("component")
@click.argument("name")
@click.argument("value")
def set_parameter(opts: Options, component: str, name: str, value: str) -> None:
    """Set a runtime parameter: COMPONENT shovel, VALUE its keys as JSON."""
    info(opts, f'Setting runtime parameter "{name}" for component "{component}" to "{value}" '
               f'in vhost "{opts.vhost}" ...')
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        error(f"Could not parse JSON document: {exc}", EX_DATAERR)
    _answer(request(opts, {"command": "set_parameter", "vhost": opts.vhost,
                           "component": component, "name": name, "value": parsed}))


@verb("clear_parameter")
@click.argument("component")
@click.argument("name")
def clear_parameter(opts: Options, component: str, name: str) -> None:
    """Remove a runtime parameter (a shovel stops)."""
    info(opts, f'Clearing runtime parameter "{name}" for component "{component}" on vhost '
               f'"{opts.vhost}" ...')
    _answer(request(opts, {"command": "clear_parameter", "vhost": opts.vhost,
                           "component": component, "name": name}))


@verb("list_parameters")
def list_parameters(opts: Options) -> None:
    """The runtime parameters: component name value."""
    info(opts, f'Listing runtime parameters for vhost "{opts.vhost}" ...')
    answer = _answer(request(opts, {"command": "list_parameters", "vhost": opts.vhost}))
    rows = [{"component": p["component"], "name": p["name"],
             "value": json.dumps(p["value"], separators=(",", ":"), sort_keys=True)}
            for p in answer.get("parameters", [])]
    emit(opts, PARAMETER_COLUMNS, rows)


@verb("shovel_status")
def shovel_status(opts: Options) -> None:
    """The shovels and their state (rabbitmqctl shovel_status)."""
    info(opts, "Shovel status on node ...")
    answer = _answer(request(opts, {"command": "shovel_status"}))
    emit(opts, ("name", "vhost", "type", "state", "src_uri", "dest_uri", "timestamp"),
         [{**r, "src_uri": r.get("src_uri", ""), "dest_uri": r.get("dest_uri", "")}
          for r in answer.get("shovels", [])])
