"""rabbitmqadmin against RabbitMQ and against Shoal, side by side: the same command list on
both, the answers compared field by field, one table row per command (same / differs: how).

    .venv/bin/python -m perf.compare_management --rabbitmq 15672,5672            # a Shoal is started
    .venv/bin/python -m perf.compare_management --rabbitmq 15672,5672 --shoal 15673,5673

Each side is MANAGEMENT_PORT,AMQP_PORT on 127.0.0.1, user guest/guest (RabbitMQ needs
``loopback_users = none`` only if it is reached through another address). RabbitMQ needs the
management plugin, which perf.brokers.RabbitBroker does not enable, so start it by hand, e.g.
in a temporary directory D owned by the rabbitmq user::

    echo '[rabbitmq_management].' > D/enabled_plugins
    printf 'listeners.tcp.default = 5672\\nmanagement.tcp.port = 15672\\n' > D/rabbitmq.conf
    HOME=D RABBITMQ_NODENAME=rmq-cmp@localhost RABBITMQ_MNESIA_BASE=D/mnesia RABBITMQ_LOG_BASE=D/log \\
    RABBITMQ_ENABLED_PLUGINS_FILE=D/enabled_plugins RABBITMQ_CONFIG_FILE=D/rabbitmq.conf \\
    ERL_EPMD_PORT=<free> rabbitmq-server &

A tool, not a test (it needs RabbitMQ and /usr/bin/rabbitmqadmin). Lists are asked for as
``-f raw_json`` and compared by their items' field names (and counts where both sides hold the
same objects); the other commands by exit status and output text (node names masked).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pika

HOST = "127.0.0.1"
Q, Q2, X, POLICY = "cmp-q", "cmp-q2", "cmp-x", "cmp-p"

# (label, rabbitmqadmin arguments, how to compare: "text" | "list" | "object" | "export")
COMMANDS: list[tuple[str, list[str], str]] = [
    ("declare queue", ["declare", "queue", f"name={Q}", "durable=false"], "text"),
    ("declare exchange", ["declare", "exchange", f"name={X}", "type=direct"], "text"),
    ("declare binding", ["declare", "binding", f"source={X}", f"destination={Q}", "routing_key=k"], "text"),
    ("declare policy", ["declare", "policy", f"name={POLICY}", "pattern=^cmp-nothing$",
                        'definition={"max-length":100}', "apply-to=queues"], "text"),
    ("publish", ["publish", f"exchange={X}", "routing_key=k", "payload=hello"], "text"),
    ("get", ["-f", "raw_json", "get", f"queue={Q}", "ackmode=ack_requeue_true"], "list"),
    ("list queues", ["-f", "raw_json", "list", "queues"], "list"),
    ("list exchanges", ["-f", "raw_json", "list", "exchanges"], "list"),
    ("list bindings", ["-f", "raw_json", "list", "bindings"], "list"),
    ("list connections", ["-f", "raw_json", "list", "connections"], "list"),
    ("list channels", ["-f", "raw_json", "list", "channels"], "list"),
    ("list consumers", ["-f", "raw_json", "list", "consumers"], "list"),
    ("list users", ["-f", "raw_json", "list", "users"], "list"),
    ("list vhosts", ["-f", "raw_json", "list", "vhosts"], "list"),
    ("list permissions", ["-f", "raw_json", "list", "permissions"], "list"),
    ("list nodes", ["-f", "raw_json", "list", "nodes"], "list"),
    ("list policies", ["-f", "raw_json", "list", "policies"], "list"),
    ("show overview", ["-f", "raw_json", "show", "overview"], "object"),
    ("list queues (default columns)", ["list", "queues"], "text"),
    ("purge queue", ["purge", "queue", f"name={Q}"], "text"),
    ("export", ["export", "{export}"], "export"),
    ("import", ["import", "{export}"], "text"),
    ("close connection", ["close", "connection", "name={connection}"], "text"),
    ("delete binding", ["delete", "binding", f"source={X}", "destination_type=queue", f"destination={Q}",
                        "properties_key=k"], "text"),
    ("delete policy", ["delete", "policy", f"name={POLICY}"], "text"),
    ("delete exchange", ["delete", "exchange", f"name={X}"], "text"),
    ("delete queue", ["delete", "queue", f"name={Q}"], "text"),
    ("delete queue (missing)", ["delete", "queue", "name=cmp-no-such-queue"], "text"),
]
# Lists whose objects are the same on both sides (the test's own ones and the defaults), so
# their counts are compared too; the others differ by design (RabbitMQ's amq.rabbitmq.trace...).
SAME_COUNT = {"get", "list connections", "list channels", "list consumers", "list users", "list vhosts",
              "list permissions", "list nodes", "list policies"}


class Side:
    """One broker: its ports, a consuming pika connection, the files the run writes."""

    def __init__(self, name: str, mgmt: int, amqp: int, workdir: str) -> None:
        self.name, self.mgmt, self.amqp = name, mgmt, amqp
        self.export = os.path.join(workdir, f"{name}-definitions.json")
        self.connection: pika.BlockingConnection | None = None

    def admin(self, args: list[str], connection: str = "") -> tuple[int, str]:
        args = [a.replace("{export}", self.export).replace("{connection}", connection) for a in args]
        run = subprocess.run(["rabbitmqadmin", "-H", HOST, "-P", str(self.mgmt), "-u", "guest", "-p", "guest",
                              *args], capture_output=True, text=True, timeout=60, check=False)
        return run.returncode, (run.stdout + run.stderr).strip().replace(self.export, "FILE")

    def open_consumer(self) -> None:
        """A connection with a consumer on Q2, so connections/channels/consumers have one each."""
        params = pika.ConnectionParameters(HOST, self.amqp, client_properties={"connection_name": "cmp"})
        self.connection = pika.BlockingConnection(params)
        channel = self.connection.channel()
        channel.queue_declare(Q2, auto_delete=True)
        channel.basic_consume(Q2, lambda *a: None)
        for _ in range(40):  # RabbitMQ lists a connection once its stats are emitted (5 s)
            if self.connection_name() != "none":
                break
            self.connection.sleep(0.25)

    def connection_name(self) -> str:
        code, out = self.admin(["-f", "raw_json", "list", "connections"])
        items = json.loads(out) if code == 0 else []
        return str(items[0]["name"]) if items else "none"


def keys(items: Any) -> set[str]:
    if isinstance(items, dict):
        return set(items)
    return set().union(*(set(i) for i in items if isinstance(i, dict))) if items else set()


def key_diff(r: set[str], s: set[str]) -> list[str]:
    out = []
    if r - s:
        out.append("Shoal lacks " + ", ".join(sorted(r - s)))
    if s - r:
        out.append("Shoal adds " + ", ".join(sorted(s - r)))
    return out


def compare(label: str, kind: str, r: tuple[int, str], s: tuple[int, str], masks: list[str]) -> str:
    (rc_r, out_r), (rc_s, out_s) = r, s
    if rc_r != rc_s:
        return f"differs: exit {rc_r} vs {rc_s} ({out_r[:80]!r} vs {out_s[:80]!r})"
    if kind == "text":
        for m in masks:
            out_r, out_s = out_r.replace(m, "NODE"), out_s.replace(m, "NODE")
        if label.startswith("list queues"):  # a table: compare its header line (the columns)
            out_r, out_s = out_r.splitlines()[1:2][0] if out_r else "", out_s.splitlines()[1:2][0] if out_s else ""
            out_r, out_s = re.sub(r"\s+", " ", out_r), re.sub(r"\s+", " ", out_s)
        return "same" if out_r == out_s else f"differs: {out_r[:100]!r} vs {out_s[:100]!r}"
    try:
        jr, js = json.loads(out_r), json.loads(out_s)
    except ValueError:
        return f"differs: not JSON ({out_r[:60]!r} / {out_s[:60]!r})"
    how = key_diff(keys(jr), keys(js))
    if kind == "list" and label in SAME_COUNT and len(jr) != len(js):
        how.append(f"{len(jr)} items vs {len(js)}")
    if label == "get" and jr and js and jr[0].get("payload") != js[0].get("payload"):
        how.append(f"payload {jr[0].get('payload')!r} vs {js[0].get('payload')!r}")
    return "same" if not how else "differs: " + "; ".join(how)


def compare_export(r: Side, s: Side) -> str:
    with open(r.export) as fr, open(s.export) as fs:
        dr, ds = json.load(fr), json.load(fs)
    how = key_diff(set(dr), set(ds))
    for section in sorted(set(dr) & set(ds)):
        if isinstance(dr[section], list) and isinstance(ds[section], list):
            how += [f"{section}: {d}" for d in key_diff(keys(dr[section]), keys(ds[section]))]
    return "same" if not how else "differs: " + "; ".join(how)


def ports(text: str) -> tuple[int, int]:
    mgmt, amqp = text.split(",")
    return int(mgmt), int(amqp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rabbitmq", required=True, help="MANAGEMENT_PORT,AMQP_PORT of a RabbitMQ with management")
    parser.add_argument("--shoal", help="MANAGEMENT_PORT,AMQP_PORT of a running Shoal (default: start one)")
    parser.add_argument("--json-out", help="also write the rows as JSON here")
    args = parser.parse_args()
    if shutil.which("rabbitmqadmin") is None:
        print("rabbitmqadmin not found", file=sys.stderr)
        return 2
    started = None
    if args.shoal:
        shoal_ports = ports(args.shoal)
    else:
        from perf.brokers import ShoalBroker, free_port

        mgmt = free_port()
        started = ShoalBroker(2, ["--management-port", str(mgmt)])
        shoal_ports = (mgmt, started.port)
    workdir = tempfile.mkdtemp(prefix="compare-management-")
    sides = [Side("rabbitmq", *ports(args.rabbitmq), workdir), Side("shoal", *shoal_ports, workdir)]
    rows: list[tuple[str, str, str]] = []
    try:
        masks = []
        for side in sides:
            code, out = side.admin(["-f", "raw_json", "show", "overview"])
            if code == 0:
                overview = json.loads(out)  # raw_json writes one object as a list of one
                masks.append(str((overview[0] if isinstance(overview, list) else overview)["node"]))
        for label, argv, kind in COMMANDS:
            if label == "list queues":
                for side in sides:
                    side.open_consumer()
            answers = [side.admin(argv, side.connection_name() if "{connection}" in " ".join(argv) else "")
                       for side in sides]
            verdict = (compare_export(*sides) if kind == "export" and answers[0][0] == answers[1][0] == 0
                       else compare(label, "text" if kind == "export" else kind, answers[0], answers[1], masks))
            rows.append((label, " ".join(argv), verdict))
    finally:
        for side in sides:
            if side.connection is not None and side.connection.is_open:
                with contextlib.suppress(Exception):  # closed by the "close connection" command
                    side.connection.close()
        if started is not None:
            started.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"| {'command'.ljust(width)} | RabbitMQ vs Shoal |")
    print(f"|{'-' * (width + 2)}|---|")
    for label, _, verdict in rows:
        print(f"| {label.ljust(width)} | {verdict} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump([{"command": label, "argv": argv, "verdict": v} for label, argv, v in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
