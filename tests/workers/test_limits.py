"""The worker's side of the vhost and user limits (workers.limits): its verdict at
connection.open and channel.open from its own count plus the other workers', RabbitMQ's texts,
and what it reports of its use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pamqp import commands

from ipc import records as r
from tests.workers.connection_helpers import method, new_connection, sent, tuned
from workers.limits import WorkerLimits


@dataclass
class Proto:
    """What WorkerLimits reads of an AMQPConnection."""

    vhost: str
    user: str
    channel_count: int = 0


@dataclass
class Handler:
    """What WorkerLimits reads of a ConnectionHandler."""

    proto: Proto
    opened: bool = True
    finished: bool = False


def handler(vhost: str = "/", user: str = "guest", channels: int = 0) -> Handler:
    return Handler(Proto(vhost, user, channels))


def test_no_limit_admits_everything_and_reports_nothing() -> None:
    """Without limits a worker counts nothing and tells the supervisor nothing."""
    limits = WorkerLimits({1: handler()}, {}, {})
    assert not limits.watching
    assert limits.admit_connection("/", "guest") is None
    assert limits.admit_channel("guest") is None
    assert limits.changed() is None


def test_the_vhost_limit_counts_this_workers_and_the_others_connections() -> None:
    """access to vhost refused once its connections here and elsewhere reach max-connections."""
    handlers: dict[int, Any] = {1: handler()}
    limits = WorkerLimits(handlers, {"/": {"max-connections": 2}}, {})
    assert limits.admit_connection("/", "guest") is None
    limits.apply(r.LimitsChanged({"/": {"max-connections": 2}}, {}, {"/": 1}, {}, {}))
    assert limits.admit_connection("/", "guest") == (
        "access to vhost '/' refused for user 'guest': connection limit (2) is reached")
    handlers[1].finished = True  # a finished connection no longer counts
    assert limits.admit_connection("/", "guest") is None


def test_zero_allows_none_and_a_negative_value_is_no_limit() -> None:
    """0 = nothing allowed, negative = no limit (RabbitMQ)."""
    assert WorkerLimits({}, {"/": {"max-connections": 0}}, {}).admit_connection("/", "u")
    assert WorkerLimits({1: handler()}, {"/": {"max-connections": -1}}, {}).admit_connection(
        "/", "guest") is None


def test_the_user_limits_count_connections_and_channels() -> None:
    """The user's max-connections after the vhost's; max-channels counts open channels only."""
    handlers: dict[int, Any] = {1: handler(user="u", channels=2), 2: handler(user="v")}
    limits = WorkerLimits(handlers, {}, {"u": {"max-connections": 1, "max-channels": 3}})
    assert limits.admit_connection("/", "u") == (
        "connection refused for user 'u': user connection limit (1) is reached")
    assert limits.admit_connection("/", "v") is None
    assert limits.admit_channel("u") is None
    handlers[1].proto.channel_count = 3
    assert limits.admit_channel("u") == (
        "number of channels opened for user 'u' has reached the maximum allowed user limit of (3)")


def test_the_report_is_sent_once_per_change_of_the_limited_use() -> None:
    """LimitUsage holds only the limited vhosts and users, and goes when it changed."""
    handlers: dict[int, Any] = {1: handler(user="u", channels=1), 2: handler(vhost="other")}
    limits = WorkerLimits(handlers, {"/": {"max-queues": 5}}, {"u": {"max-channels": 4}})
    assert limits.changed() == r.LimitUsage({}, {"u": 1}, {"u": 1})
    assert limits.changed() is None
    del handlers[1]
    assert limits.changed() == r.LimitUsage({}, {}, {})


def test_connection_open_over_a_limit_is_530_with_the_verdict() -> None:
    """AMQPConnection refuses connection.open with 530 and the text WorkerLimits gives, and
    a new channel past the user's max-channels with 530, class and method 0."""
    conn = new_connection()
    conn.limits = WorkerLimits({}, {"/": {"max-connections": 0}}, {})
    tuned(conn)
    conn.receive_data(method(0, commands.Connection.Open("/")))
    [(_, close)] = sent(conn)
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    assert close.reply_text == ("NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
                                "connection limit (0) is reached")

    conn = new_connection()
    conn.limits = WorkerLimits({}, {}, {"guest": {"max-channels": 0}})
    tuned(conn)
    conn.receive_data(method(0, commands.Connection.Open("/")))
    conn.data_to_send()
    conn.receive_data(method(1, commands.Channel.Open()))
    [(_, close)] = sent(conn)
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
    assert "maximum allowed user limit of (0)" in close.reply_text


def test_channel_opens_in_one_read_count_the_ones_before_them() -> None:
    """A client that sends three channel.opens at once with max-channels 2 gets two channels
    and a 530: the count is the protocol's, not the runtime's events."""
    conn = new_connection()
    conn.limits = WorkerLimits({1: Handler(conn)}, {}, {"guest": {"max-channels": 2}})  # type: ignore[arg-type]
    tuned(conn)
    conn.receive_data(method(0, commands.Connection.Open("/")))
    conn.data_to_send()
    conn.receive_data(b"".join(method(n, commands.Channel.Open()) for n in (1, 2, 3)))
    frames = [f for _, f in sent(conn)]
    assert [type(f) for f in frames] == [commands.Channel.OpenOk, commands.Channel.OpenOk,
                                         commands.Connection.Close]


def test_the_limits_are_checked_before_the_vhost_permission() -> None:
    """rabbit_reader's connection.open: the vhost's limit, the user's, then vhost access."""
    conn = new_connection()
    conn.limits = WorkerLimits({}, {}, {"guest": {"max-connections": 0}})
    conn.vhost_access = lambda user, vhost: False
    tuned(conn)
    conn.receive_data(method(0, commands.Connection.Open("/")))
    [(_, close)] = sent(conn)
    assert close.reply_text == ("NOT_ALLOWED - connection refused for user 'guest': user "
                                "connection limit (0) is reached")
