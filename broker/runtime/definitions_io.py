"""Definitions import: RabbitMQ's definitions JSON into the running supervisor.

The one importer behind every import path: ``shoal serve --load-definitions FILE`` (RabbitMQ's
``load_definitions``; the supervisor, after the data directory is recovered and before a worker
accepts), the control command ``import_definitions`` (``shoal ctl import_definitions``) and
``POST /api/definitions`` (the management process sends the body to that control command).

What a file holds (RabbitMQ 3.x's export, ``rabbitmqadmin export`` / ``rabbitmqctl
export_definitions``), in the order RabbitMQ imports it:

* ``rabbit_version``, ``rabbitmq_version``, ``product_name``, ``product_version``: accepted;
* ``users``: ``password_hash`` of the user's ``hashing_algorithm``, one of RabbitMQ's
  (``rabbit_password_hashing_sha256``, ``_sha512``, ``_md5``: ``broker.passwords``); without one,
  the file's top-level ``hashing_algorithm``, else md5 in a file of RabbitMQ 3.0 to 3.5, else
  sha256 (RabbitMQ's ``hashing_algorithm/2``); ``tags`` (a list, or one string ``"a,b"``); a hash
  that is not of its algorithm, or an unknown algorithm, is skipped by name; a user's ``limits``,
  when it has some, become its limits (broker.runtime.limits);
* ``vhosts``: those not here are added (the control server's ``add_vhost``; a broker without
  it names them, skipped with everything in them); each object below goes into the vhost it
  names (none named: ``/``); a vhost's ``limits`` (older exports) become its limits;
* ``permissions``, ``topic_permissions``, ``policies``, ``parameters`` (component
  ``vhost-limits``: the vhost's limits, as RabbitMQ 3.10 exports them; the others with a runtime
  that keeps them: shovels), then ``exchanges``, ``queues``, ``bindings``;
* ``global_parameters`` (``cluster_name``, ``internal_cluster_id``, ...): each named, unsupported.

Idempotent, as RabbitMQ imports ``load_definitions`` at every boot: an object equal to the one the
broker has is left alone (not rewritten); a user, permission or policy that differs is replaced,
as RabbitMQ's import replaces it, and named; an exchange or queue that exists with other
properties is refused (PRECONDITION_FAILED, as a client's redeclare) and named.

Nothing is dropped silently: a top-level key or an object Shoal does not support goes into the
report's ``unsupported``, a refused or replaced object into ``skipped``; each line is logged at
WARNING here and returned to the caller. A malformed file (not JSON, not one object, a list key
that is not a list of objects) raises :class:`DefinitionsError` (one line) before anything
changes.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.errors import AMQPError
from broker.limits import VHOST_COMPONENT
from broker.passwords import SHA256
from broker.runtime.dispatch import Dispatcher
from broker.runtime.permissions import RuntimePermissions
from broker.runtime.policies import RuntimePolicies
from broker.runtime.users import RuntimeUsers, UserError, parse_tags

log = logging.getLogger("shoal.definitions")

MD5 = "rabbit_password_hashing_md5"
# Files of these RabbitMQ versions hold md5 hashes without saying so (3.6.0 started sha256).
MD5_VERSIONS = tuple(f"3.{minor}." for minor in range(6))
METADATA_KEYS = ("rabbit_version", "rabbitmq_version", "product_name", "product_version",
                 "hashing_algorithm")
LIST_KEYS = ("users", "vhosts", "permissions", "topic_permissions", "parameters",
             "global_parameters", "policies", "queues", "exchanges", "bindings")
COUNTED = ("users", "permissions", "topic_permissions", "policies", "parameters", "limits",
           "exchanges", "queues", "bindings")


class DefinitionsError(ValueError):
    """A definitions document that cannot be imported at all (one line)."""


class Parameters(Protocol):
    """The runtime parameters (broker.runtime.parameters: shovels), as the control server has
    them: one async command entry point."""

    async def command(self, command: str, request: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class ImportReport:
    imported: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    unchanged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    skipped: list[str] = field(default_factory=list)  # refused, conflicting or replaced objects
    unsupported: list[str] = field(default_factory=list)  # keys and objects Shoal lacks

    def as_json(self) -> dict[str, Any]:
        return {"imported": self.imported, "unchanged": self.unchanged, "skipped": self.skipped,
                "unsupported": self.unsupported}

    def summary(self) -> str:
        done = ", ".join(f"{n} {k}" for k, n in self.imported.items() if n) or "nothing new"
        same = sum(self.unchanged.values())
        return (f"imported {done}; {same} unchanged; {len(self.skipped)} skipped; "
                f"{len(self.unsupported)} unsupported")


def check(body: Any) -> dict[str, Any]:
    """``body`` when it is a definitions document; else :class:`DefinitionsError`."""
    if not isinstance(body, dict):
        raise DefinitionsError("expected the definitions as one JSON object")
    for key in LIST_KEYS:
        items = body.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise DefinitionsError(f"'{key}' must be a list, not {type(items).__name__}")
        for k, item in enumerate(items):
            if not isinstance(item, dict):
                raise DefinitionsError(f"'{key}'[{k}] must be an object, not {type(item).__name__}")
    return body


def parse(text: str, where: str = "definitions") -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise DefinitionsError(f"{where}: not valid JSON: {exc}") from None
    try:
        return check(body)
    except DefinitionsError as exc:
        raise DefinitionsError(f"{where}: {exc}") from None


def read(path: str) -> list[tuple[str, dict[str, Any]]]:
    """The file at ``path`` parsed -- or, as RabbitMQ's ``load_definitions`` takes a directory,
    each ``*.json`` in it in name order: (path, document) pairs."""
    if os.path.isdir(path):
        paths = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".json"))
    else:
        paths = [path]
    out = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise DefinitionsError(f"{p}: {(exc.strerror or str(exc)).lower()}") from None
        except UnicodeDecodeError as exc:
            raise DefinitionsError(f"{p}: not UTF-8 text: {exc.reason}") from None
        out.append((p, parse(text, p)))
    return out


@dataclass
class VhostPlan:
    """What a file's ``vhosts`` ask of a broker that has some already (:func:`vhost_plan`)."""

    add: list[dict[str, Any]]  # add_vhost requests: {name, description, tags, default_queue_type?}
    present: list[str]  # named in the file, here already
    limits: dict[str, dict[str, Any]]  # a vhost's ``limits`` key (older exports), when set


def vhost_plan(vhosts: list[dict[str, Any]], existing: Collection[str]) -> VhostPlan:
    """Which of the file's vhosts to add and which are here; RabbitMQ 3.10 exports a vhost's
    description and tags both at the top and in ``metadata``."""
    plan = VhostPlan([], [], {})
    for v in vhosts:
        name = str(v.get("name") or "")
        if not name or name in plan.present or any(a["name"] == name for a in plan.add):
            continue
        if isinstance(v.get("limits"), dict) and v["limits"]:
            plan.limits[name] = v["limits"]
        if name in existing:
            plan.present.append(name)
            continue
        meta: dict[str, Any] = v["metadata"] if isinstance(v.get("metadata"), dict) else {}
        tags = v.get("tags", meta.get("tags")) or []
        request = {"name": name,
                   "description": str(v.get("description", meta.get("description")) or ""),
                   "tags": [str(t) for t in tags] if isinstance(tags, list) else
                           [t for t in str(tags).split(",") if t]}
        if queue_type := v.get("default_queue_type", meta.get("default_queue_type")):
            request["default_queue_type"] = str(queue_type)
        plan.add.append(request)
    return plan


class Importer:
    """Applies a checked document to the supervisor's users, permissions, policies, parameters
    and virtual host (module text)."""

    def __init__(self, dispatcher: Dispatcher, flush: Callable[[], None],
                 users: RuntimeUsers | None, permissions: RuntimePermissions | None,
                 policies: RuntimePolicies | None, parameters: Parameters | None) -> None:
        self._dispatcher = dispatcher
        self._flush = flush
        self._users = users
        self._permissions = permissions
        self._policies = policies
        self._parameters = parameters
        self._vhost = dispatcher.vhost.name
        # The control server's add_vhost, when this broker keeps more vhosts than "/"
        self.add_vhost: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None

    async def run(self, body: Any, source: str = "definitions") -> ImportReport:
        body = check(body)
        report = ImportReport()
        self._report = report
        self._user_limits: list[tuple[str, Any]] = []
        for key in body:
            if key not in LIST_KEYS and key not in METADATA_KEYS:
                self._unsupported(f"key '{key}': not supported by this Shoal, ignored")
        await self._vhosts_of(body)
        await self._users_of(body)
        for name, limits in self._user_limits:
            self._limits("user", name, limits)
        await self._permissions_of(body)
        self._policies_of(body)
        await self._parameters_of(body)
        for p in body.get("global_parameters") or []:
            self._unsupported(f"global parameter '{p.get('name')}': not supported by this "
                              "Shoal, ignored")
        self._topology(body)
        log.info("%s: %s", source, report.summary())
        return report

    # -- reporting ------------------------------------------------------------------------

    def _unsupported(self, line: str) -> None:
        log.warning("definitions: %s", line)
        self._report.unsupported.append(line)

    def _skipped(self, line: str) -> None:
        log.warning("definitions: %s", line)
        self._report.skipped.append(line)

    def _where(self, what: str, item: dict[str, Any]) -> str | None:
        """The vhost ``item`` lies in (none named: "/"), when the broker has it; if not, the
        item is named as skipped."""
        vhost = str(item.get("vhost", self._vhost))
        if vhost in self._dispatcher.vhosts:
            return vhost
        self._unsupported(f"{what} in vhost '{vhost}': no such vhost here, skipped")
        return None

    # -- vhosts, users, permissions, policies, parameters ---------------------------------

    async def _vhosts_of(self, body: dict[str, Any]) -> None:
        """The file's vhosts that are not here are added (``add_vhost``, when this broker has
        it); a vhost's ``limits`` (older exports) become its limits."""
        plan = vhost_plan(body.get("vhosts") or [], self._dispatcher.vhosts.by_name)
        for v in plan.add:
            if self.add_vhost is None:
                self._unsupported(f"vhost '{v['name']}': not here, and this broker adds no "
                                  "vhost at runtime: skipped with everything in it")
                continue
            answer = await self.add_vhost({"command": "add_vhost", **v})
            if "error" in answer:
                self._skipped(f"vhost '{v['name']}': {answer['error']}, skipped")
        for name, limits in plan.limits.items():
            if name in self._dispatcher.vhosts:
                self._limits("vhost", name, limits)


    async def _users_of(self, body: dict[str, Any]) -> None:
        version = str(body.get("rabbitmq_version") or body.get("rabbit_version") or "")
        default_hashing = str(body.get("hashing_algorithm")
                              or (MD5 if version.startswith(MD5_VERSIONS) else SHA256))
        for u in body.get("users") or []:
            name = str(u.get("name") or "")
            what = f"user '{name}'"
            if self._users is None:
                self._unsupported(f"{what}: this broker keeps no users at runtime, skipped")
                continue
            algorithm = str(u.get("hashing_algorithm") or default_hashing)
            if isinstance(u.get("limits"), dict) and u["limits"]:
                self._limits("user", name, u["limits"], after_users=True)
            raw_tags = u.get("tags")  # RabbitMQ 3.10 exports ["a,b"] for tags set as "a,b"
            tags = parse_tags(",".join(map(str, raw_tags)) if isinstance(raw_tags, list)
                              else raw_tags)
            stored = str(u.get("password_hash") or "")
            old = self._users.table.get(name)
            if old == stored and sorted(self._users.tags_of(name)) == sorted(tags):
                self._report.unchanged["users"] += 1
                continue
            try:
                await self._users.put(name, None, stored, tags, algorithm)
            except UserError as exc:
                self._skipped(f"{what}: password hashing {algorithm}: {exc}, skipped")
                continue
            self._report.imported["users"] += 1
            if old is not None:
                self._skipped(f"{what}: existed with another password or tags: replaced by the "
                              "file's")

    async def _permissions_of(self, body: dict[str, Any]) -> None:
        admin = self._permissions
        for p in body.get("permissions") or []:
            user = str(p.get("user") or "")
            what = f"permissions of user '{user}'"
            if admin is None:
                self._unsupported(f"{what}: this broker keeps no permissions at runtime, skipped")
                continue
            if (vhost := self._where(what, p)) is None:
                continue
            perms = tuple(str(p.get(k, "")) for k in ("configure", "write", "read"))
            old = admin.table.get(user, {}).get(vhost)
            if old is not None and tuple(old) == perms:
                self._report.unchanged["permissions"] += 1
                continue
            try:
                await admin.set(user, vhost, *perms)
            except UserError as exc:
                self._skipped(f"{what}: {exc}, skipped")
                continue
            self._report.imported["permissions"] += 1
            if old is not None:
                self._skipped(f"{what}: were {tuple(old)}: replaced by the file's {perms}")
        for p in body.get("topic_permissions") or []:
            user, exchange = str(p.get("user") or ""), str(p.get("exchange") or "")
            what = f"topic permissions of user '{user}' on exchange '{exchange}'"
            if admin is None:
                self._unsupported(f"{what}: this broker keeps no permissions at runtime, skipped")
                continue
            if (vhost := self._where(what, p)) is None:
                continue
            pair = (str(p.get("write", "")), str(p.get("read", "")))
            old_pair = admin.topics.get(user, {}).get(vhost, {}).get(exchange)
            if old_pair is not None and tuple(old_pair) == pair:
                self._report.unchanged["topic_permissions"] += 1
                continue
            try:
                await admin.set_topic(user, vhost, exchange, *pair)
            except UserError as exc:
                self._skipped(f"{what}: {exc}, skipped")
                continue
            self._report.imported["topic_permissions"] += 1
            if old_pair is not None:
                self._skipped(f"{what}: were {tuple(old_pair)}: replaced by the file's {pair}")

    def _policies_of(self, body: dict[str, Any]) -> None:
        for p in body.get("policies") or []:  # before the queues, as RabbitMQ imports them
            what = f"policy '{p.get('name')}'"
            if self._policies is None:
                self._unsupported(f"{what}: this broker keeps no policies at runtime, skipped")
                continue
            if (vhost := self._where(what, p)) is None:
                continue
            listed = self._policies.command("list_policies", {"vhost": vhost})
            old = next((q for q in listed.get("policies", []) if q.get("name") == p.get("name")),
                       None)
            answer = self._policies.command("set_policy", {**p, "vhost": vhost})
            if "error" in answer:
                reason = " ".join(str(answer["error"]).split())
                self._skipped(f"{what}: {reason}, skipped")
                continue
            new = {k: v for k, v in answer.items() if k != "created"}
            if old is not None and old == new:
                self._report.unchanged["policies"] += 1
                continue
            self._report.imported["policies"] += 1
            if old is not None:
                self._skipped(f"{what}: existed with another definition: replaced by the file's")

    async def _parameters_of(self, body: dict[str, Any]) -> None:
        for p in body.get("parameters") or []:  # RabbitMQ's {value, vhost, component, name}
            what = f"parameter '{p.get('component')}/{p.get('name')}'"
            if self._parameters is None:
                self._unsupported(f"{what}: not supported by this Shoal, skipped")
                continue
            if (vhost := self._where(what, p)) is None:
                continue
            if p.get("component") == VHOST_COMPONENT:
                self._limits("vhost", vhost, p.get("value"))
                continue
            answer = await self._parameters.command("set_parameter", {**p, "vhost": vhost})
            if "error" in answer:
                self._skipped(f"{what}: {' '.join(str(answer['error']).split())}, skipped")
            else:
                self._report.imported["parameters"] += 1

    def _limits(self, kind: str, name: str, limits: Any, after_users: bool = False) -> None:
        """A vhost's limits (all of them) or a user's (merged), as the file has them. A user's
        wait for the users (``after_users``: they come with its object, before it exists)."""
        if after_users:
            self._user_limits.append((name, limits))
            return
        admin = self._dispatcher.limits
        old = admin.vhosts.get(name, {}) if kind == "vhost" else admin.users.get(name, {})
        command = "set_vhost_limits" if kind == "vhost" else "set_user_limits"
        answer = admin.command(command, {kind: name, "limits": limits})
        if "error" in answer:
            self._skipped(f"limits of {kind} '{name}': {answer['error']}, skipped")
        elif answer["value"] == old:
            self._report.unchanged["limits"] += 1
        else:
            self._report.imported["limits"] += 1

    # -- exchanges, queues, bindings ------------------------------------------------------

    def _topology(self, body: dict[str, Any]) -> None:
        d = self._dispatcher
        report = self._report

        def attempt(kind: str, what: str, existed: bool, declare: Callable[..., object],
                    *args: Any, **kwargs: Any) -> None:
            """Declared as a client's declare is: an equal one exists -> unchanged; one with
            other properties -> PRECONDITION_FAILED, named and skipped."""
            try:
                declare(*args, **kwargs)
            except AMQPError as exc:
                self._skipped(f"{what}: {exc.reply_text}, skipped")
                return
            except (TypeError, ValueError, KeyError) as exc:
                self._skipped(f"{what}: {exc}, skipped")
                return
            (report.unchanged if existed else report.imported)[kind] += 1

        d.begin_batch(time.monotonic())
        try:
            for x in body.get("exchanges") or []:
                name = str(x.get("name") or "")
                what = f"exchange '{name}'"
                if not name or name.startswith("amq.") or (where := self._where(what, x)) is None:
                    continue  # the default and amq.* exchanges exist already (RabbitMQ: same)
                vhost = d.vhosts.by_name[where]
                attempt("exchanges", what, name in vhost.exchanges, vhost.declare_exchange, name,
                        str(x.get("type", "direct")), durable=bool(x.get("durable", True)),
                        auto_delete=bool(x.get("auto_delete", False)),
                        internal=bool(x.get("internal", False)),
                        arguments=dict(x.get("arguments") or {}))
            for q in body.get("queues") or []:
                name = str(q.get("name") or "")
                what = f"queue '{name}'"
                if not name or (where := self._where(what, q)) is None:
                    continue
                vhost = d.vhosts.by_name[where]
                args = dict(q.get("arguments") or {})
                if args.get("x-queue-type") == "classic":
                    args.pop("x-queue-type")
                attempt("queues", what, name in vhost.queues, vhost.declare_queue, name,
                        owner=None, durable=bool(q.get("durable", True)),
                        auto_delete=bool(q.get("auto_delete", False)), arguments=args)
            for b in body.get("bindings") or []:
                src, dst = str(b.get("source") or ""), str(b.get("destination", ""))
                key, args = str(b.get("routing_key", "")), dict(b.get("arguments") or {})
                kind = b.get("destination_type", "queue")
                what = f"binding of '{src}' to {kind} '{dst}' ({key!r})"
                if not src or (where := self._where(what, b)) is None:
                    continue  # the default exchange's bindings come with their queues
                vhost = d.vhosts.by_name[where]
                if kind == "exchange":
                    attempt("bindings", what, False, vhost.bind_exchange, dst, src, key, args)
                else:
                    attempt("bindings", what, False, vhost.bind_queue, dst, src, key, args,
                            owner=None)
        finally:
            d.end_batch()
            self._flush()
