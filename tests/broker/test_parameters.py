"""broker.parameters: RabbitMQ's AMQP URIs and the dynamic shovel's keys (issue 39)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.parameters import ParameterError, parse_uri, redact, shovel_settings, validate

BASE: dict[str, Any] = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://h/x",
                        "dest-queue": "b"}


def test_uris_as_rabbitmq_reads_them() -> None:
    u = parse_uri("amqp://user:p%40ss@host.example:5673/my%2fvhost")
    assert (u.host, u.port, u.user, u.password, u.vhost) == (
        "host.example", 5673, "user", "p@ss", "my/vhost")
    assert parse_uri("amqp://host").vhost == "/"
    assert parse_uri("amqp://host/%2f").vhost == "/"
    assert parse_uri("amqp://host/").vhost == "/"
    assert parse_uri("amqps://host").port == 5671
    local = parse_uri("amqp://")
    assert local.local and (local.user, local.password, local.vhost) == ("guest", "guest", "/")
    assert parse_uri("amqp://bob:pw@/v").local
    assert redact("amqp://u:secret@h:1/%2f") == "amqp://u:***@h:1/%2f"
    assert redact("amqp://h") == "amqp://h"


@pytest.mark.parametrize("uri", ["http://h", "amqp://h:notaport", "amqp://h/a/b", 5, None])
def test_uris_refused(uri: Any) -> None:
    with pytest.raises(ParameterError, match="not a valid URI"):
        parse_uri(uri)


def test_defaults_and_lists() -> None:
    s = shovel_settings({**BASE, "src-uri": ["amqp://a", "amqp://b"]})
    assert s.src_uris == ["amqp://a", "amqp://b"]
    assert (s.prefetch, s.ack_mode, s.reconnect_delay, s.delete_after) == (
        1000, "on-confirm", 5.0, "never")
    x = shovel_settings({"src-uri": "amqp://", "src-exchange": "e", "dest-uri": "amqp://",
                         "dest-exchange": "d", "dest-exchange-key": "k"})
    assert (x.src_exchange, x.src_exchange_key, x.dest_exchange_key) == ("e", "#", "k")
    old = shovel_settings({**BASE, "delete-after": 5, "prefetch-count": 10})
    assert (old.delete_after, old.prefetch) == (5, 10)


@pytest.mark.parametrize(("change", "reason"), [
    ({"src-queue": None}, "Must specify 'src-exchange' or 'src-queue'"),
    ({"src-exchange": "e"}, "Cannot specify 'src-exchange' and 'src-queue'"),
    ({"dest-exchange": "e"}, "Cannot specify 'dest-exchange' and 'dest-queue'"),
    ({"ack-mode": "sometimes"}, "ack-mode should be one of"),
    ({"src-delete-after": "soon"}, "src-delete-after should be"),
    ({"src-delete-after": -1}, "src-delete-after should be"),
    ({"src-prefetch-count": "many"}, "src-prefetch-count should be"),
    ({"reconnect-delay": -2}, "reconnect-delay should be"),
    ({"dest-uri": "ftp://x"}, "not a valid URI"),
    ({"src-uri": []}, "src-uri should be"),
    ({"dest-add-forward-headers": "yes"}, "dest-add-forward-headers should be boolean"),
    ({"dest-publish-properties": {"colour": 1}}, "unknown properties"),
    ({"src-protocol": "amqp10"}, "amqp10 is not supported"),
    ({"surprise": 1}, "Unrecognised terms"),
])
def test_invalid_values_get_rabbitmqs_reason(change: dict[str, Any], reason: str) -> None:
    value = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ParameterError) as caught:
        validate("shovel", "s", value)
    assert str(caught.value).startswith("Validation failed\n\n")
    assert reason in str(caught.value)


def test_queue_and_consumer_args_are_taken() -> None:
    """src-queue-args, dest-queue-args and src-consumer-args take RabbitMQ's argument names."""
    s = shovel_settings({**BASE, "src-queue-args": {"x-max-priority": 5},
                         "dest-queue-args": {"x-queue-mode": "lazy", "x-max-length": 10},
                         "src-consumer-args": {"x-priority": 3}})
    assert s.src_queue_args == {"x-max-priority": 5}
    assert s.dest_queue_args == {"x-queue-mode": "lazy", "x-max-length": 10}
    assert s.src_consumer_args == {"x-priority": 3}
    empty = shovel_settings({**BASE, "src-queue-args": [], "src-consumer-args": {}})
    assert (empty.src_queue_args, empty.dest_queue_args, empty.src_consumer_args) == ({}, {}, {})


@pytest.mark.parametrize(("change", "problem"), [
    ({"src-queue-args": {"x-foo": 1}}, 'Unrecognised terms [{<<"x-foo">>,1}] in src-queue-args'),
    ({"dest-queue-args": {"x-delivery-limit": "v"}},
     'Unrecognised terms [{<<"x-delivery-limit">>,<<"v">>}] in dest-queue-args'),
    ({"src-consumer-args": {"x-credit": 1}},
     'Unrecognised terms [{<<"x-credit">>,1}] in src-consumer-args'),
    ({"dest-queue-args": "x"}, 'dest-queue-args should be a JSON object, actually was "x"'),
    ({"bogus": 1}, 'Unrecognised terms [{<<"bogus">>,1}] in s'),
])
def test_unknown_arguments_are_refused_with_rabbitmqs_text(change: dict[str, Any],
                                                           problem: str) -> None:
    """An argument name RabbitMQ 3.10.8 does not take is refused with its text."""
    with pytest.raises(ParameterError) as caught:
        validate("shovel", "s", {**BASE, **change})
    assert caught.value.problem == problem


def test_missing_keys_and_components() -> None:
    with pytest.raises(ParameterError, match='Key "dest-uri" not found'):
        validate("shovel", "s", {"src-uri": "amqp://", "src-queue": "a"})
    with pytest.raises(ParameterError, match="component no-such-plugin not found"):
        validate("no-such-plugin", "s", BASE)
    validate("shovel", "s", {**BASE, "src-delete-after": "queue-length", "ack-mode": "no-ack"})


def test_the_store_keeps_parameters_under_their_own_digest(tmp_path: Any) -> None:
    from broker.storage.definition_store import DefinitionStore, inspect

    path = tmp_path / "definitions.db"
    store = DefinitionStore(path)
    store.put_parameter("/", "shovel", "s", BASE)
    store.put_parameter("/", "shovel", "s", {**BASE, "dest-queue": "c"})  # replaced
    store.put_parameter("/", "shovel", "t", BASE)
    assert store.delete_parameter("/", "shovel", "t")
    assert not store.delete_parameter("/", "shovel", "t")
    store.close()
    assert inspect(path).problem is None
    store = DefinitionStore(path)
    assert store.parameters() == [{"value": {**BASE, "dest-queue": "c"}, "vhost": "/",
                                   "component": "shovel", "name": "s"}]
    store._db.execute("DROP TRIGGER parameters_update")
    store._db.execute("UPDATE parameters SET value = '{}'")  # damage the trigger would have seen
    store.close()
    assert "parameters do not match their digest" in str(inspect(path).problem)
