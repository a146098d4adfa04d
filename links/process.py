"""The links process: every dynamic shovel and federation link of one broker, on one asyncio loop.

Started by the supervisor (broker.runtime.shovel_child, which describes the pipes) as
``python -m links.process SETTINGS_JSON``. Its stdin brings the parameters (the whole table
first, then each set and clear); its stdout takes each shovel's status rows; its log goes to
stderr as the broker's does. EOF on the inherited ``alive`` pipe, or on stdin, ends it; so does
SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

from broker.parameters import ParameterError
from ipc.profiling import run_profiled
from links import frames
from links.federating import Federation, ask
from links.shovel import Shovel

log = logging.getLogger("shoal.links")

REPORT_EVERY = 2.0  # seconds between counter updates of a running shovel


class Links:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.local = (str(settings.get("amqp_host") or "127.0.0.1"), int(settings["amqp_port"]))
        self.control_path = str(settings.get("control_path") or "")
        self.shovels: dict[tuple[str, str], tuple[Shovel, asyncio.Task[None]]] = {}
        self.done = asyncio.Event()
        self.federation = Federation(self.control_path, self.local, self.emit)

    def emit(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(json.dumps(message, default=str) + "\n")
            sys.stdout.flush()

    def report(self, row: dict[str, Any]) -> None:
        self.emit({"status": row})

    def set(self, param: dict[str, Any]) -> None:
        if param.get("component") != "shovel":
            self.federation.set(param)
            return
        key = (str(param["vhost"]), str(param["name"]))
        self.stop(key, gone=False)
        try:
            shovel = Shovel(key[0], key[1], param["value"], self.local, self.report, self.finished)
        except ParameterError as exc:
            log.error("shovel '%s': %s", key[1], exc.problem)
            return
        task = asyncio.get_running_loop().create_task(shovel.run())
        self.shovels[key] = (shovel, task)

    def stop(self, key: tuple[str, str], gone: bool = True) -> None:
        entry = self.shovels.pop(key, None)
        if entry is not None:
            entry[1].cancel()
            log.info("shovel '%s' in vhost '%s' stopped", key[1], key[0])
        if gone:
            self.emit({"gone": list(key)})

    async def finished(self, vhost: str, name: str) -> None:
        """src-delete-after reached: the broker clears the parameter (and then tells us)."""
        request = {"command": "clear_parameter", "vhost": vhost, "component": "shovel",
                   "name": name}
        try:
            await ask(self.control_path, request)
        except (TimeoutError, OSError, ValueError) as exc:
            log.error("shovel '%s': cannot clear its parameter: %s", name, exc)

    def heard(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if "parameters" in message:
            wanted = {(str(p["vhost"]), str(p["name"])) for p in message["parameters"]
                      if p.get("component") == "shovel"}
            for key in set(self.shovels) - wanted:
                self.stop(key)
            self.federation.replace(message["parameters"])
            for p in message["parameters"]:
                self.set(p)
        if isinstance(message.get("set"), dict):
            self.set(message["set"])
        if isinstance(message.get("clear"), dict):
            c = message["clear"]
            if c.get("component", "shovel") == "shovel":
                self.stop((str(c.get("vhost")), str(c.get("name"))))
            else:
                self.federation.clear(c)

    async def read_stdin(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = await reader.readline()
            if not line:
                break
            self.heard(line)
        self.done.set()

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY)
            for shovel, _ in list(self.shovels.values()):
                shovel.report_if_changed()

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.done.set)
        alive = int(self.settings.get("alive_fd", -1))
        if alive >= 0:
            def supervisor_gone() -> None:
                with contextlib.suppress(OSError):
                    if os.read(alive, 1):
                        return
                loop.remove_reader(alive)
                log.error("the supervisor is gone; the links process ends")
                self.done.set()
            loop.add_reader(alive, supervisor_gone)
        tasks = [loop.create_task(self.read_stdin()), loop.create_task(self.tick()),
                 loop.create_task(self.federation.poll())]
        await self.done.wait()
        links = [t for _, t in self.shovels.values()] + self.federation.tasks()
        for task in links + tasks:
            task.cancel()
        await asyncio.gather(*links, *tasks, return_exceptions=True)


def main(argv: list[str]) -> int:
    settings = json.loads(argv[1])
    logging.basicConfig(
        level=str(settings.get("log_level") or "info").upper(),
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    logging.getLogger("aiormq").setLevel(logging.ERROR)
    frames.install()
    run_profiled("links", asyncio.run, Links(settings).main())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
