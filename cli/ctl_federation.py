"""``shoal ctl``'s federation verb: federation_status (rabbitmqctl's, from the
rabbitmq_federation plugin): each federation link and its state."""

from __future__ import annotations

import click

from cli.ctl_group import EX_SOFTWARE, Options, emit, error, info, request, verb

COLUMNS = ("type", "name", "vhost", "upstream", "exchange", "upstream_exchange", "queue",
           "upstream_queue", "status", "local_connection", "uri", "timestamp", "error")


@verb("federation_status")
@click.option("--only-down", is_flag=True, help="Only the links that are not running.")
def federation_status(opts: Options, only_down: bool) -> None:
    """The federation links and their state (rabbitmqctl federation_status)."""
    info(opts, "Listing federation links on node ...")
    answer = request(opts, {"command": "federation_status"})
    if "error" in answer:
        error(str(answer["error"]).rstrip("\n"), EX_SOFTWARE)
    rows = [{**{c: "" for c in COLUMNS}, "name": r.get("exchange") or r.get("queue") or "", **r}
            for r in answer.get("links", [])
            if not only_down or r.get("status") != "running"]
    emit(opts, COLUMNS, rows)
