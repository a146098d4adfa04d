"""The links process's federation: which links should run, from the parameters and the policies.

The supervisor tells the links process every runtime parameter (``links.process``): the
``federation-upstream`` and ``federation-upstream-set`` values are kept here. While there is at
least one upstream, :meth:`Federation.poll` asks the control socket for ``federation_targets``
every POLL seconds -- the exchanges and queues a policy federates, with an exchange's bindings
and a queue's consumers and depth (``broker.runtime.parameters.federation_targets``) -- and
starts a link (``links.federation``) per (object, upstream) that should run, stops those that
should not, restarts one whose upstream changed, and hands each running link its object's
latest state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from broker.federation import Upstream, node_name, upstreams_for
from links.federation import LINKS, Link

log = logging.getLogger("shoal.federation")

POLL = 0.5  # seconds between two looks at the federated objects
COMPONENTS = ("federation-upstream", "federation-upstream-set")


async def ask(control_path: str, request: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One control command (broker.runtime.control); OSError / TimeoutError when unanswered."""
    reader, writer = await asyncio.open_unix_connection(control_path, limit=1 << 26)
    try:
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        answer = json.loads(await asyncio.wait_for(reader.readline(), timeout) or b"{}")
    finally:
        writer.close()
    return answer if isinstance(answer, dict) else {}


class Federation:
    """Every federation link of this broker (module text)."""

    def __init__(self, control_path: str, local: tuple[str, int],
                 emit: Callable[[dict[str, Any]], None]) -> None:
        self.control_path = control_path
        self.local = local
        self.node = node_name(local[1])
        self._emit = emit
        self.parameters: dict[tuple[str, str, str], Any] = {}  # (vhost, component, name)
        self.links: dict[tuple[str, ...], tuple[Link, asyncio.Task[None]]] = {}
        self.wake = asyncio.Event()

    def set(self, param: dict[str, Any]) -> None:
        if param.get("component") in COMPONENTS:
            self.parameters[(str(param["vhost"]), str(param["component"]),
                             str(param["name"]))] = param["value"]
            self.wake.set()

    def clear(self, param: dict[str, Any]) -> None:
        key = (str(param.get("vhost")), str(param.get("component")), str(param.get("name")))
        if self.parameters.pop(key, None) is not None:
            self.wake.set()

    def replace(self, params: list[dict[str, Any]]) -> None:
        self.parameters.clear()
        for p in params:
            self.set(p)
        self.wake.set()

    def report(self, key: list[str], row: dict[str, Any]) -> None:
        self._emit({"link": {"key": key, "row": row}})

    async def poll(self) -> None:
        """Every POLL seconds while an upstream exists: the links that should run, running."""
        while True:
            if not any(c == "federation-upstream" for _, c, _ in self.parameters):
                self.adjust({})
                self.wake.clear()
                await self.wake.wait()
                continue
            try:
                targets = await ask(self.control_path, {"command": "federation_targets"})
            except (OSError, TimeoutError, ValueError) as exc:
                log.warning("federation: cannot read the federated objects: %s", exc)
            else:
                self.adjust(self.wanted(targets))
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), POLL)

    def wanted(self, targets: dict[str, Any]) -> dict[tuple[str, ...], tuple[dict[str, Any],
                                                                            Upstream]]:
        """(vhost, type, name, upstream) -> (the object, its upstream) for each link to run."""
        vhost = str(targets.get("vhost") or "/")
        mine = {(c, n): v for (h, c, n), v in self.parameters.items() if h == vhost}
        wanted: dict[tuple[str, ...], tuple[dict[str, Any], Upstream]] = {}
        for kind in ("exchange", "queue"):
            for target in targets.get(kind + "s") or []:
                for upstream in upstreams_for(target.get("policy"), mine):
                    wanted[(vhost, kind, str(target["name"]), upstream.name)] = (target, upstream)
        return wanted

    def adjust(self, wanted: dict[tuple[str, ...], tuple[dict[str, Any], Upstream]]) -> None:
        for key in [k for k, (link, _) in self.links.items()
                    if k not in wanted or wanted[k][1] != link.upstream]:
            self.stop(key)
        loop = asyncio.get_running_loop()
        for key, (target, upstream) in wanted.items():
            entry = self.links.get(key)
            if entry is not None:
                entry[0].update(target)
                continue
            link = LINKS[key[1]](key[0], target, upstream, self.node, self.local, self.report)
            self.links[key] = (link, loop.create_task(link.run()))
            log.info("federation link for %s '%s' in vhost '%s' (upstream '%s') started",
                     key[1], key[2], key[0], key[3])

    def stop(self, key: tuple[str, ...]) -> None:
        _, task = self.links.pop(key)
        task.cancel()
        log.info("federation link for %s '%s' in vhost '%s' (upstream '%s') stopped",
                 key[1], key[2], key[0], key[3])
        self._emit({"link_gone": list(key)})

    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for _, task in self.links.values()]
