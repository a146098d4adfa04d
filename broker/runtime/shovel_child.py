"""The links process (shovels, federation links) as the supervisor's child: started, told, restarted, ended.

Shovels are AMQP clients of other brokers (and of this one); they never run on the supervisor's
loop or in a worker. The supervisor starts ``python -m links.process`` (asyncio, an AMQP 0-9-1
client library) as it starts the management process (broker.runtime.management_child), the
first time a shovel or federation parameter exists -- a broker without them never starts it -- and again
whenever it dies (``broker.runtime.child_process``). Nothing here imports ``links/``:
the supervisor knows it by its module name only.

The pipes, JSON lines each way:

* its stdin, ours: ``{"parameters": [param, ...]}`` first (the whole table: the URIs hold
  passwords, so they never go in its argv), then ``{"set": param}`` and ``{"clear": {"vhost",
  "name"}}`` as ``broker.runtime.parameters`` changes them;
* its stdout, ours: ``{"status": {vhost, name, state, reason, ...}}`` at each state change of a
  shovel (and its counters now and then), ``{"gone": [vhost, name]}`` when one is stopped.
  Those rows are what ``/api/shovels`` lists (the control command ``shovel_status``). A
  federation link's are ``{"link": {"key": [...], "row": {...}}}`` and ``{"link_gone": key}``
  (``/api/federation-links``, the control command ``federation_status``).

The read end of the supervisor's ``alive`` pipe is inherited: EOF there (the supervisor died)
ends the process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

from broker.runtime.child_process import SupervisedChild, start_module

MODULE = "links.process"
LINE_LIMIT = 1 << 20


class ShovelChild(SupervisedChild):
    """The links process of one broker and the last status it reported per shovel."""

    what = "links process"
    why = " (shovels)"

    def __init__(self) -> None:
        super().__init__()
        self._parameters: Callable[[], list[dict[str, Any]]] = list
        self.status: dict[tuple[str, str], dict[str, Any]] = {}
        # federation links: (vhost, type, exchange or queue, upstream) -> its status row
        self.links: dict[tuple[str, ...], dict[str, Any]] = {}
        self._wanted = trio.Event()

    def want(self) -> None:
        """A shovel exists: start the process (once; it then lives until the broker stops)."""
        self._wanted.set()

    async def supervise(self, settings: Callable[[], dict[str, Any]],
                        parameters: Callable[[], list[dict[str, Any]]],
                        stopping: Callable[[], bool]) -> None:
        await self._wanted.wait()
        self._parameters = parameters
        await self._supervise(settings, stopping)

    async def _lifetime(self, process: trio.Process) -> int:
        """The whole table first, then its status lines read until it exits."""
        await self.tell({"parameters": self._parameters()})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, process)
            code = await process.wait()
            await trio.sleep(0.05)  # what it wrote last is read
            nursery.cancel_scope.cancel()
        return code

    def _restarting(self) -> None:
        for key, row in self.status.items():
            self.status[key] = {**row, "state": "starting", "reason": "links process restarting"}
        for link, row in self.links.items():
            self.links[link] = {**row, "status": "starting"}

    async def _read(self, process: trio.Process) -> None:
        assert process.stdout is not None
        buffer = b""
        while True:
            try:
                chunk = await process.stdout.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > LINE_LIMIT:
                buffer = b""
            for line in lines:
                self._heard(line)

    def _heard(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        row = message.get("status")
        if isinstance(row, dict):
            self.status[(str(row.get("vhost")), str(row.get("name")))] = row
        gone = message.get("gone")
        if isinstance(gone, list) and len(gone) == 2:
            self.status.pop((str(gone[0]), str(gone[1])), None)
        link = message.get("link")
        if isinstance(link, dict) and isinstance(link.get("key"), list):
            self.links[tuple(map(str, link["key"]))] = link["row"]
        gone = message.get("link_gone")
        if isinstance(gone, list):
            self.links.pop(tuple(map(str, gone)), None)

    async def _spawn(self, settings: dict[str, Any]) -> trio.Process:
        return await start_module(MODULE, settings, [settings["alive_fd"]], stdout=True)
