"""Vhost and user limits in the supervisor (broker.limits, broker.runtime.limits) and in
definitions.db: RabbitMQ's validation texts, set/merge/clear as rabbitmqctl and the management
API change them, the queue limit, the workers' use relayed, the export shape, the store."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import PreconditionFailed
from broker.limits import USER_LIMITS, VHOST_LIMITS, LimitError, export_limits, validate
from broker.runtime.limits import RuntimeLimits
from broker.storage.definition_store import DefinitionStore, inspect
from ipc import records as r


def runtime(store: DefinitionStore | None = None) -> tuple[RuntimeLimits, list[list[Any]]]:
    outbox: list[list[Any]] = [[], []]
    limits = RuntimeLimits(outbox, lambda: {"/"})
    limits.attach(store, {"guest": "x", "u": "y"}, lambda: None)
    return limits, outbox


def test_validation_has_rabbitmqs_texts() -> None:
    """Unknown limits and values that are no number are refused with RabbitMQ's words."""
    assert validate({"max-queues": 3, "max-connections": -1.0}, VHOST_LIMITS, "limits") == {
        "max-queues": 3, "max-connections": -1}
    with pytest.raises(LimitError, match=r'Unrecognised terms \[\{<<"bogus">>,1\}\] in limits'):
        validate({"bogus": 1}, VHOST_LIMITS, "limits")
    with pytest.raises(LimitError, match="in user-limits"):
        validate({"max-queues": 1}, USER_LIMITS, "user-limits")
    with pytest.raises(LimitError, match="max-channels should be a number, actually was 'x'"):
        validate({"max-channels": "x"}, USER_LIMITS, "user-limits")
    with pytest.raises(LimitError):
        validate({"max-channels": True}, USER_LIMITS, "user-limits")


def test_vhost_limits_are_replaced_user_limits_merged() -> None:
    """set_vhost_limits replaces the vhost's set (rabbit_vhost_limit:set); set_user_limits adds
    to the user's; one limit is set or cleared alone; every worker is told each change."""
    limits, outbox = runtime()
    limits.command("set_vhost_limits", {"vhost": "/", "limits": {"max-queues": 1}})
    limits.command("set_vhost_limits", {"vhost": "/", "limits": {"max-connections": 2}})
    assert limits.vhosts == {"/": {"max-connections": 2}}
    limits.command("set_vhost_limit", {"vhost": "/", "name": "max-queues", "value": 4})
    limits.command("clear_vhost_limit", {"vhost": "/", "name": "max-connections"})
    assert limits.command("list_vhost_limits", {}) == {
        "limits": [{"vhost": "/", "value": {"max-queues": 4}}]}
    limits.command("set_user_limits", {"user": "u", "limits": {"max-channels": 1}})
    limits.command("set_user_limits", {"user": "u", "limits": {"max-connections": 1}})
    assert limits.users == {"u": {"max-channels": 1, "max-connections": 1}}
    limits.command("clear_user_limits", {"user": "u", "name": "max-channels"})
    assert limits.users == {"u": {"max-connections": 1}}
    limits.command("clear_user_limits", {"user": "u", "name": "all"})
    assert limits.command("list_user_limits", {"user": "u"}) == {"limits": []}
    assert all(isinstance(rec, r.LimitsChanged) for rec in outbox[0]) and len(outbox[1]) == 8
    assert limits.command("set_vhost_limits", {"vhost": "no", "limits": {}})["code"] == "missing"
    assert limits.command("set_user_limits", {"user": "no", "limits": {}})["code"] == "missing"
    assert limits.command("set_user_limits", {"user": "u", "limits": {"x": 1}})["code"] == "invalid"


def test_max_queues_counts_only_new_queues() -> None:
    """A declare that would create a queue past max-queues is 406; an existing one is fine;
    0 allows none, a negative value is no limit."""
    limits, _ = runtime()
    limits.check_queue("/", {"a"}, "b")  # no limit
    limits.set_vhost("/", {"max-queues": 1})
    limits.check_queue("/", {"a"}, "a")
    with pytest.raises(PreconditionFailed, match=(
            r"cannot declare queue 'b': queue limit in vhost '/' \(1\) is reached")):
        limits.check_queue("/", {"a"}, "b")
    limits.set_vhost("/", {"max-queues": 0})
    with pytest.raises(PreconditionFailed):
        limits.check_queue("/", set(), "a")
    limits.set_vhost("/", {"max-queues": -1})
    limits.check_queue("/", {"a"}, "b")


def test_each_worker_hears_the_sum_of_the_others_use() -> None:
    """A worker's LimitUsage goes to the others, summed; a dead worker's is forgotten."""
    limits, outbox = runtime()
    limits.set_user("u", {"max-connections": 3})
    for box in outbox:
        box.clear()
    limits.usage_reported(0, r.LimitUsage({}, {"u": 2}, {"u": 5}))
    assert outbox[0] == []
    [told] = outbox[1]
    assert (told.user_connections, told.user_channels) == ({"u": 2}, {"u": 5})
    limits.usage_reported(1, r.LimitUsage({}, {"u": 1}, {}))
    assert outbox[0][-1].user_connections == {"u": 1}
    assert limits.command("limit_usage", {})["user_connections"] == {"u": 3}
    limits.forget_worker(0)
    assert outbox[1][-1].user_connections == {}


def test_the_export_shape_is_rabbitmq_3_10s() -> None:
    """User limits in the user's ``limits``, vhost limits as a ``vhost-limits`` parameter."""
    defs: dict[str, Any] = {"users": [{"name": "u", "limits": {}}, {"name": "v", "limits": {}}],
                            "parameters": []}
    export_limits(defs, [{"vhost": "/", "value": {"max-queues": 2}}],
                  [{"user": "u", "value": {"max-channels": 1}}])
    assert defs["users"] == [{"name": "u", "limits": {"max-channels": 1}}, {"name": "v", "limits": {}}]
    assert defs["parameters"] == [{"value": {"max-queues": 2}, "vhost": "/",
                                   "component": "vhost-limits", "name": "limits"}]


def test_the_store_keeps_limits_under_their_own_digest(tmp_path: Any) -> None:
    """Limits are rows of definitions.db, restored by attach; a deleted user's go with it;
    a row changed behind the triggers' back fails the digest."""
    path = tmp_path / "definitions.db"
    store = DefinitionStore(path)
    store.put_users({"u": "x", "guest": "y"})
    limits, _ = runtime(store)
    limits.set_vhost("/", {"max-connections": 5, "max-queues": 9})
    limits.set_vhost("/", {"max-queues": 8})
    limits.set_user("u", {"max-channels": 2})
    limits.set_user("guest", {"max-connections": 1})
    store.delete_user("guest")
    store.close()
    assert inspect(path).problem is None
    store = DefinitionStore(path)
    limits, _ = runtime(store)
    assert limits.vhosts == {"/": {"max-queues": 8}}
    assert limits.users == {"u": {"max-channels": 2}}
    store._db.execute("DROP TRIGGER user_limits_update")
    store._db.execute("UPDATE user_limits SET value = 99")
    store.close()
    assert "user_limits do not match their digest" in str(inspect(path).problem)

