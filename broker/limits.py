"""The names of the vhost and user limits (RabbitMQ 3.10.8's rabbit_vhost_limit and
rabbit_auth_backend_internal), their check, and their place in a definitions export: pure, for
the supervisor (broker.runtime.limits), shoal ctl and the management process alike."""

from __future__ import annotations

from typing import Any

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")
VHOST_COMPONENT = "vhost-limits"  # a vhost's limits as a runtime parameter (definitions)


class LimitError(Exception):
    """A change refused: ``code`` is ``missing`` (no such vhost or user) or ``invalid``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def validate(limits: Any, known: tuple[str, ...], where: str) -> dict[str, int]:
    """``limits`` as {name: integer}, or LimitError("invalid") with RabbitMQ's text (``where``:
    ``limits`` for a vhost's, ``user-limits`` for a user's)."""
    if not isinstance(limits, dict):
        raise LimitError("invalid", f"{where} must be a JSON object, not {limits!r}")
    unknown = [(k, v) for k, v in limits.items() if k not in known]
    if unknown:
        terms = ",".join(f'{{<<"{k}">>,{v}}}' for k, v in unknown)
        raise LimitError("invalid", f"Unrecognised terms [{terms}] in {where}")
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise LimitError("invalid", f"{name} should be a number, actually was {value!r}")
    return {name: int(value) for name, value in limits.items()}


def export_limits(definitions: dict[str, Any], vhost_rows: list[dict[str, Any]],
                  user_rows: list[dict[str, Any]]) -> None:
    """Put the limits (list_vhost_limits and list_user_limits rows) into a definitions export as
    RabbitMQ 3.10 does: each user's in its ``limits``, each vhost's as a parameter of component
    ``vhost-limits`` named ``limits``."""
    by_user = {row["user"]: row["value"] for row in user_rows}
    for user in definitions.get("users") or []:
        user["limits"] = dict(by_user.get(user["name"], {}))
    definitions.setdefault("parameters", []).extend(
        {"value": dict(row["value"]), "vhost": row["vhost"], "component": VHOST_COMPONENT,
         "name": "limits"} for row in vhost_rows)
