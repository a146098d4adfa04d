"""``shoal ctl``: rabbitmqctl's verbs, arguments and output, against a running Shoal.

Theory of operation
-------------------
Every verb is one or two requests to the supervisor's control socket
(``broker.runtime.control``), chosen with ``--port`` (the default socket of the broker on that
AMQP port) or ``--control-socket``. What comes back is printed as rabbitmqctl 3.10 prints it:
an informational line (``Listing queues for vhost / ...``; left out with ``-q``), then for a
listing the column names (left out with ``-s`` or ``--no-table-headers``) and tab-separated
rows, booleans as ``true``/``false``, argument tables as Erlang-ish ``[{"x-max-length",10}]``
and tags as ``[administrator]``; ``--formatter json`` prints the rows as rabbitmqctl's JSON
formatter does (one object per line inside ``[`` ``]``). The general options (``-q``, ``-s``,
``-p``, ``--formatter``, ``-t``, ``-n``) are taken before or after the verb, as rabbitmqctl
takes them.

Exit codes are rabbitmqctl's (sysexits): 64 a usage error, 65 bad data (no password given),
67 no such user, 69 the broker is unavailable (no answer) or the verb is not supported by this
Shoal yet, 70 any other failure (a user that already exists).

The modules: ``cli.ctl_group`` (the group, the general options, requests, exit codes, output),
``cli.ctl_format`` (the pure formatting and rows ``tests/cli/test_ctl.py`` checks), the verbs by
kind in ``cli.ctl_lists``, ``cli.ctl_users`` (users and permissions), ``cli.ctl_objects``
(queues, connections, definitions, the node), ``cli.ctl_policies`` and ``cli.ctl_limits``; here,
the verbs Shoal lacks. The integration tests drive the verbs against a broker.
"""

from __future__ import annotations

import click

# Each verb module registers its verbs on the group when imported: a new one is one more name here.
from cli import (  # noqa: F401
    ctl_federation,
    ctl_limits,
    ctl_lists,
    ctl_objects,
    ctl_parameters,
    ctl_policies,
    ctl_users,
)
from cli.ctl_group import ctl, not_supported

__all__ = ["ctl"]

# ------------------------------------------------------------------ not yet

UNSUPPORTED = ("add_vhost", "delete_vhost", "set_vhost_tags", "restart_vhost", "set_policy",
               "clear_policy", "list_policies", "set_operator_policy", "clear_operator_policy",
               "list_operator_policies", "set_parameter", "clear_parameter", "list_parameters",
               "set_global_parameter", "clear_global_parameter", "list_global_parameters",
               "clear_password", "trace_on", "trace_off")


def _unsupported(name: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True},
                   help="Not supported by this Shoal yet.", add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        not_supported(name)
    return command


for _name in UNSUPPORTED:
    if _name not in ctl.commands:  # a verb served since (the policies) keeps its command
        ctl.add_command(_unsupported(_name))
