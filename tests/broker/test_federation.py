"""broker.federation and the x-federation-upstream exchange type: RabbitMQ's loop rules
(rabbit_federation_util should_forward, exchange_link update_binding), upstream sets, and the
parameter and policy checks (rabbit_federation_parameters)."""

from __future__ import annotations

import pytest

from broker.errors import CommandInvalid
from broker.federation import (
    BINDING_HEADER,
    ROUTING_HEADER,
    Upstream,
    bound_from,
    received_from,
    safe_uri,
    should_forward,
    upstream_queue_name,
    upstreams_for,
)
from broker.parameters import ParameterError, validate
from broker.topology.exchange import Exchange
from broker.topology.policies import PolicyError, make_policy

ARGS = {"x-max-hops": 2, "x-downstream-name": "shoal@b", "x-downstream-vhost": "/"}


def hop(name: str, vhost: str = "/") -> dict[str, object]:
    return {"uri": "amqp://h", "exchange": "x", "redelivered": False, "cluster-name": name,
            "vhost": vhost}


def test_upstream_exchange_routes_like_fanout_below_max_hops() -> None:
    """x-federation-upstream: every binding, while x-received-from is shorter than x-max-hops."""
    x = Exchange("federation: x -> shoal@b A", "x-federation-upstream", arguments=ARGS)
    x.bind("q1", "ignored")
    x.bind("q2", "")
    assert x.route("any", None) == {"q1", "q2"}
    assert x.route("any", {ROUTING_HEADER: [hop("shoal@a")]}) == {"q1", "q2"}
    assert x.route("any", {ROUTING_HEADER: [hop("shoal@a"), hop("shoal@c")]}) == set()


def test_upstream_exchange_drops_what_passed_its_downstream() -> None:
    """A message that already came through the downstream node (same vhost) goes no further."""
    x = Exchange("f", "x-federation-upstream", arguments=ARGS)
    x.bind("q", "")
    assert x.route("k", {ROUTING_HEADER: [hop("shoal@b")]}) == set()
    assert x.route("k", {ROUTING_HEADER: [{**hop("shoal@b"), "vhost": b"other"}]}) == {"q"}
    assert x.route("k", {ROUTING_HEADER: [{**hop("x"), "cluster-name": b"shoal@b"}]}) == set()


def test_upstream_exchange_needs_max_hops() -> None:
    """rabbit_federation_upstream_exchange validate: x-max-hops is a long."""
    with pytest.raises(CommandInvalid):
        Exchange("f", "x-federation-upstream")


def test_should_forward_without_the_header() -> None:
    assert should_forward(None, 1, "n", "/")
    assert should_forward({ROUTING_HEADER: "not an array"}, 1, "n", "/")


def test_received_from_prepends() -> None:
    """rabbit_basic prepend_table_header: the newest hop first."""
    headers = received_from({ROUTING_HEADER: [hop("a")], "other": 1}, hop("b"))
    assert [h["cluster-name"] for h in headers[ROUTING_HEADER]] == ["b", "a"]
    assert headers["other"] == 1


def test_bindings_propagate_with_hops_counting_down() -> None:
    """update_binding: hops = min(previous - 1, max-hops); 0, or a binding from the upstream
    itself, propagates no further."""
    first = bound_from({"a": 1}, 2, "shoal@a", "/", "shoal@b", "/", "x", "B")
    assert first is not None and first["a"] == 1
    assert first[BINDING_HEADER] == [{"cluster-name": "shoal@b", "vhost": "/",
                                      "exchange": "/:x B", "hops": 2}]
    second = bound_from(first, 5, "shoal@z", "/", "shoal@c", "/", "x", "A")
    assert second is not None and second[BINDING_HEADER][0]["hops"] == 1
    assert bound_from(second, 5, "shoal@y", "/", "shoal@d", "/", "x", "A") is None
    assert bound_from(first, 5, "shoal@b", "/", "shoal@c", "/", "x", "A") is None  # its origin
    assert bound_from(None, 1, None, "/", "n", "/", "x", "B") is not None


def test_upstream_queue_name() -> None:
    """exchange_link upstream_queue_name: the downstream's name and vhost only where they
    differ."""
    assert upstream_queue_name("x", "/", "x", "/", "shoal@h") == "federation: x -> shoal@h"
    assert upstream_queue_name("u", "/", "x", "/", "n") == "federation: u -> n:x"
    assert upstream_queue_name("x", "v", "x", "/", "n") == "federation: x -> n:/:x"


def test_safe_uri_has_no_credentials() -> None:
    assert safe_uri("amqp://user:secret@host:5673/%2f") == "amqp://host:5673/%2f"
    assert safe_uri("amqp://host") == "amqp://host"


def test_upstreams_of_a_policy() -> None:
    """federation-upstream NAME, a set's members with their overrides, and the set all."""
    params = {("federation-upstream", "a"): {"uri": "amqp://a", "max-hops": 2},
              ("federation-upstream", "b"): {"uri": ["amqp://b1", "amqp://b2"]},
              ("federation-upstream-set", "s"): [{"upstream": "a", "max-hops": 5},
                                                 {"upstream": "missing"}]}
    [a] = upstreams_for({"federation-upstream": "a"}, params)
    assert (a.name, a.max_hops, a.prefetch, a.ack_mode, a.reconnect_delay) == (
        "a", 2, 1000, "on-confirm", 5.0)
    [s] = upstreams_for({"federation-upstream-set": "s"}, params)
    assert (s.name, s.max_hops) == ("a", 5)
    every = upstreams_for({"federation-upstream-set": "all"}, params)
    assert [u.name for u in every] == ["a", "b"]
    assert every[1].uris == ("amqp://b1", "amqp://b2")
    assert upstreams_for({"federation-upstream": "nope"}, params) == []
    assert upstreams_for({"max-length": 1}, params) == []
    assert Upstream.of("u", {"uri": "amqp://"}).consumer_tag == "federation-link-u"


@pytest.mark.parametrize(("component", "value", "reason"), [
    ("federation-upstream", {}, 'Key "uri" not found in u'),
    ("federation-upstream", {"uri": 5}, "uri should be binary, actually was 5"),
    ("federation-upstream", {"uri": "http://h"}, '"http://h" not a valid URI'),
    ("federation-upstream", {"uri": "amqp://", "prefetch-count": True},
     "prefetch-count should be a number, actually was true"),
    ("federation-upstream", {"uri": "amqp://", "trust-user-id": "yes"},
     'trust-user-id should be boolean, actually was <<"yes">>'),
    ("federation-upstream-set", {"upstream": "a"}, "u should be a list"),
    ("federation-upstream-set", [{"upstream": 1}], "upstream should be binary"),
])
def test_parameter_validation(component: str, value: object, reason: str) -> None:
    with pytest.raises(ParameterError) as caught:
        validate(component, "u", value)
    assert str(caught.value).startswith("Validation failed\n\n")
    assert reason in caught.value.problem


def test_policy_keys() -> None:
    """rabbit_federation_parameters validate_policy: a name each, not both at once."""
    policy = make_policy("/", "p", ".", {"federation-upstream-set": "all"})
    assert policy.definition == {"federation-upstream-set": "all"}
    with pytest.raises(PolicyError, match="is not a valid federation upstream name"):
        make_policy("/", "p", ".", {"federation-upstream": 1})
    with pytest.raises(PolicyError, match="cannot specify federation-upstream and"):
        make_policy("/", "p", ".", {"federation-upstream": "a", "federation-upstream-set": "b"})
