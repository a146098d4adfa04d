"""Runtime parameters (shovels, federation upstreams): ``shoal ctl set_parameter``, ``PUT /api/parameters``.

Theory of operation
-------------------
A change comes over the control socket (``broker.runtime.control``: set_parameter,
clear_parameter, list_parameters, shovel_status) and is applied as policies are
(``broker.runtime.policies``):

1. validated (``broker.parameters``: RabbitMQ's ``Validation failed`` text);
2. written to the data directory's definitions (``DefinitionStore.put_parameter`` /
   ``delete_parameter``, on disk when it returns);
3. kept in the table here and told to the links process (``broker.runtime.shovel_child``), which
   starts, restarts or stops the shovel, or adjusts its federation links (which also follow the
   policies: it polls ``federation_targets``, below). The first parameter starts that process.

At start the stored parameters are read back and the links process is started with them, so a
shovel outlives a restart of its broker. ``shovel_status`` lists every shovel parameter with
the state its process last reported (RabbitMQ's /api/shovels rows); one it has not reported yet
is ``starting``.

Called from: the supervisor process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container
from typing import Any

from broker.federation import POLICY_KEYS, UPSTREAM_TYPE
from broker.parameters import ParameterError, parse_uri, redact, validate
from broker.runtime.shovel_child import ShovelChild
from broker.storage.definition_store import DefinitionStore
from broker.topology.vhost import VirtualHost

log = logging.getLogger("shoal.parameters")

PARAMETER_COMMANDS = frozenset({"set_parameter", "clear_parameter", "list_parameters",
                                "shovel_status", "federation_status"})


def _first_uri(value: Any, key: str) -> str:
    uri = value.get(key) if isinstance(value, dict) else None
    if isinstance(uri, list):
        uri = uri[0] if uri else ""
    if not isinstance(uri, str):
        return ""
    try:
        return parse_uri(uri).redacted()
    except ParameterError:
        return redact(uri)


class RuntimeParameters:
    """The supervisor's side of the parameter commands (module text)."""

    def __init__(self, vhosts: Container[str], store: DefinitionStore | None,
                 child: ShovelChild) -> None:
        self._vhosts = vhosts  # those that exist (the dispatcher's, which change)
        self._store = store
        self.child = child
        self.table: dict[tuple[str, str, str], dict[str, Any]] = {}
        for p in store.parameters() if store is not None else []:
            try:
                validate(p["component"], p["name"], p["value"])
            except ParameterError as exc:
                log.error("definitions: parameter '%s' not restored: %s", p["name"],
                          exc.problem)
                continue
            self.table[(p["vhost"], p["component"], p["name"])] = p
        if self.table:
            child.want()

    def listing(self) -> list[dict[str, Any]]:
        return [self.table[k] for k in sorted(self.table)]

    async def command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        if command == "shovel_status":
            return {"shovels": self.shovel_status()}
        if command == "federation_status":
            return {"links": [self.child.links[k] for k in sorted(self.child.links)]}
        vhost = request.get("vhost")
        component = request.get("component")
        if command == "list_parameters":
            return {"parameters": [p for p in self.listing()
                                   if vhost in (None, p["vhost"])
                                   and component in (None, p["component"])]}
        vhost = str(vhost or "/")
        if vhost not in self._vhosts:
            return {"error": f"Virtual host '{vhost}' does not exist", "code": "missing"}
        component, name = str(component or ""), str(request.get("name") or "")
        key = (vhost, component, name)
        if command == "clear_parameter":
            if key not in self.table:
                return {"error": f"Parameter does not exist ({component} '{name}' in vhost "
                                 f"'{vhost}')", "code": "missing"}
            if self._store is not None:
                self._store.delete_parameter(vhost, component, name)
            del self.table[key]
            if component == "shovel":
                self.child.status.pop((vhost, name), None)
            await self.child.tell({"clear": {"vhost": vhost, "component": component,
                                             "name": name}})
            log.info("parameter %s '%s' cleared", component, name)
            return {"cleared": name}
        value = request.get("value")
        try:
            validate(component, name, value)
        except ParameterError as exc:
            return {"error": str(exc), "code": "invalid"}
        created = key not in self.table
        param = {"value": value, "vhost": vhost, "component": component, "name": name}
        if self._store is not None:
            self._store.put_parameter(vhost, component, name, value)
        self.table[key] = param
        if component == "shovel":
            self.child.status.pop((vhost, name), None)
        self.child.want()
        await self.child.tell({"set": param})
        log.info("parameter %s '%s' set", component, name)
        return {**param, "created": created}

    def shovel_status(self) -> list[dict[str, Any]]:
        """RabbitMQ's /api/shovels rows: each shovel parameter, with its reported state."""
        rows = []
        for (vhost, component, name), p in sorted(self.table.items()):
            if component != "shovel":
                continue
            reported = self.child.status.get((vhost, name))
            if reported is None:
                reported = {"state": "starting", "reason": None,
                            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S")}
            rows.append({
                "node": "", "name": name, "vhost": vhost, "type": "dynamic",
                "src_uri": _first_uri(p["value"], "src-uri"),
                "dest_uri": _first_uri(p["value"], "dest-uri"),
                **{k: v for k, v in reported.items() if k not in ("name", "vhost")}})
        return rows


def federation_targets(vhost: VirtualHost) -> dict[str, Any]:
    """The control command ``federation_targets`` (the links process polls it): each exchange
    and queue a policy with ``federation-upstream`` / ``federation-upstream-set`` applies to,
    with what its links need -- an exchange's bindings, a queue's consumers and depth."""
    exchanges, queues = [], []
    for kind, name in list(vhost.applied):
        definition = vhost.policy_of(kind, name)[1] or {}
        policy = {k: definition[k] for k in POLICY_KEYS if k in definition}
        if not policy:
            continue
        if kind == "exchange":
            x = vhost.exchanges.get(name)
            if x is None or not name or x.type == UPSTREAM_TYPE:
                continue
            exchanges.append({"name": name, "type": x.type, "durable": x.durable,
                              "auto_delete": x.auto_delete, "internal": x.internal,
                              "arguments": x.arguments, "policy": policy,
                              "bindings": [[b.routing_key, b.arguments] for b in x.bindings()]})
        else:
            q = vhost.queues.get(name)
            if q is None or q.deleted:
                continue
            queues.append({"name": name, "durable": q.durable, "auto_delete": q.auto_delete,
                           "arguments": q.arguments, "policy": policy,
                           "consumers": q.consumer_count, "messages": q.message_count})
    return {"vhost": vhost.name, "exchanges": exchanges, "queues": queues}
