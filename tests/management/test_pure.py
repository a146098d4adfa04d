"""The management API's pure parts: RabbitMQ's list parameters, binding keys, rates, auth."""

from __future__ import annotations

import base64
import json
import os

import pytest

from broker.passwords import hash_password
from management import listing, shapes
from management.auth import Users, parse_basic
from management.process import read_users
from management.stats import Sample, rate

ITEMS = [{"name": f"q{i:02}", "messages": i % 3, "stats": {"rate": float(i)}} for i in range(25)]


def test_without_page_a_plain_list_sorted_by_name() -> None:
    out = listing.apply(list(reversed(ITEMS)), {})
    assert isinstance(out, list) and [i["name"] for i in out] == [i["name"] for i in ITEMS]


def test_pages_carry_rabbitmqs_counts() -> None:
    out = listing.apply(ITEMS, {"page": "2", "page_size": "10"})
    assert isinstance(out, dict)
    assert {k: out[k] for k in ("page", "page_count", "page_size", "filtered_count", "total_count",
                                "item_count")} == {"page": 2, "page_count": 3, "page_size": 10,
                                                    "filtered_count": 25, "total_count": 25,
                                                    "item_count": 10}
    assert out["items"][0]["name"] == "q10"


def test_name_filters_by_substring_or_regex() -> None:
    out = listing.apply(ITEMS, {"page": "1", "name": "Q1"})
    assert isinstance(out, dict) and out["filtered_count"] == 10 and out["total_count"] == 25
    for flag in ("true", "True"):
        out = listing.apply(ITEMS, {"page": "1", "name": "^q0[12]$", "use_regex": flag})
        assert isinstance(out, dict) and [i["name"] for i in out["items"]] == ["q01", "q02"]
    assert listing.apply(ITEMS, {"name": "^q0[12]$", "use_regex": "false"}) == []


def test_sort_by_a_dotted_column_reversed_and_columns_kept() -> None:
    out = listing.apply(ITEMS, {"sort": "stats.rate", "sort_reverse": "true",
                                "columns": "name,stats.rate"})
    assert isinstance(out, list)
    assert out[0] == {"name": "q24", "stats": {"rate": 24.0}}
    out = listing.apply(ITEMS, {"sort": "messages,name"})
    assert isinstance(out, list) and [i["name"] for i in out[:2]] == ["q00", "q03"]


@pytest.mark.parametrize("query", [{"page": "9"}, {"page": "0"}, {"page": "1", "page_size": "501"},
                                   {"page": "x"}, {"name": "(", "use_regex": "true"}])
def test_bad_list_parameters_are_400s(query: dict[str, str]) -> None:
    with pytest.raises(listing.BadRequest):
        listing.apply(ITEMS, query)


def test_truthy_takes_rabbitmqs_booleans() -> None:
    assert listing.truthy(True) and listing.truthy("true") and listing.truthy("TRUE")
    assert not listing.truthy(False) and not listing.truthy("false") and not listing.truthy("")


def test_properties_key() -> None:
    assert shapes.properties_key("", {}) == "~"
    assert shapes.properties_key("a.b", None) == "a.b"
    assert shapes.properties_key("a/b c", {}) == "a%252Fb+c"
    with_args = shapes.properties_key("k", {"x-match": "all", "a": 1})
    assert with_args.startswith("k~") and with_args == shapes.properties_key("k", {"a": 1, "x-match": "all"})
    assert shapes.matches_properties_key("~", "", {})
    assert shapes.matches_properties_key("a%2Fb+c", "a/b c", {})  # the URL decoded once
    assert not shapes.matches_properties_key("k", "k", {"a": 1})


def _sample(t: float, ready: int, unacked: int, enqueued: int, recv: int) -> Sample:
    snapshot = {"time": t, "vhost": "/", "queues": [["q", True, False, None, {}, ready, unacked, 0,
                                                     enqueued]],
                "exchanges": [], "bindings": [], "consumers": [], "channels": []}
    conns = [{"name": "c", "worker": 0, "conn": 1, "peer": "127.0.0.1:5000", "recv_oct": recv,
              "send_oct": 0}]
    return Sample.of(snapshot, conns)


def test_rates_are_deltas_over_the_time_between_samples() -> None:
    assert rate(30, 10, 5.0) == 4.0 and rate(1, 0, 0.0) == 0.0
    node = shapes.Node("shoal@h", "127.0.0.1", 5672, 15672, "0.1.0")
    old, new = _sample(100.0, 10, 0, 100, 0), _sample(105.0, 20, 5, 150, 5000)
    (q,) = shapes.queue_items(new, old, node)
    assert q["messages"] == 25 and q["messages_details"] == {"rate": 3.0}
    assert q["messages_ready_details"] == {"rate": 2.0}
    stats = q["message_stats"]
    assert stats["publish"] == 150 and stats["publish_details"] == {"rate": 10.0}
    assert stats["deliver_get"] == 0 and stats["ack_details"] == {"rate": 0.0}
    (c,) = shapes.connection_items(new, old, node)
    assert c["recv_oct_details"] == {"rate": 1000.0} and c["peer_port"] == 5000
    assert shapes.queue_totals(new, old)["messages_details"] == {"rate": 3.0}
    (first,) = shapes.queue_items(new, None, node)
    assert first["messages_details"] == {"rate": 0.0}


def test_basic_auth_against_stored_hashes_and_guest_only_from_loopback() -> None:
    users = Users({"guest": hash_password("guest"), "ann": hash_password("pw")})

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert users.check(header("ann", "pw"), "10.0.0.5") == ("ann", "pw")
    assert users.check(header("ann", "nope"), "127.0.0.1") is None
    assert users.check(header("guest", "guest"), "127.0.0.1") == ("guest", "guest")
    assert users.check(header("guest", "guest"), "::1") == ("guest", "guest")
    assert users.check(header("guest", "guest"), "10.0.0.5") is None
    assert users.check(None, "127.0.0.1") is None and parse_basic("Bearer x") is None
    assert Users({}).check(header("guest", "guest"), "127.0.0.1") is None


def test_channels_are_the_workers_open_channels_merged_with_the_supervisors_books() -> None:
    node = shapes.Node("shoal@h", "127.0.0.1", 5672, 15672, "0.1.0")
    snapshot = {"time": 1.0, "vhost": "/", "queues": [], "exchanges": [], "bindings": [],
                "consumers": [], "channels": [[0, 1, 2, 1, 4], [0, 1, 9, 0, 1]]}
    chans = [{"number": n, "prefetch": p, "global_prefetch": 0, "confirm": n == 2, "tx": False,
              "consumers": 0, "unacked": 0} for n, p in ((1, 7), (2, 0))]
    conns = [{"name": "127.0.0.1:5000 -> 127.0.0.1:5672", "worker": 0, "conn": 1,
              "peer": "127.0.0.1:5000", "client_properties": {"product": "P",
                                                              "connection_name": "mine"},
              "open_channels": chans}]
    sample = Sample.of(snapshot, conns)
    (c,) = shapes.connection_items(sample, None, node)
    assert c["client_properties"]["product"] == "P" and c["user_provided_name"] == "mine"
    one, two, nine = shapes.channel_items(sample, node)
    assert one["name"] == "127.0.0.1:5000 -> 127.0.0.1:5672 (1)" and one["prefetch_count"] == 7
    assert one["consumer_count"] == 0 and one["state"] == "running" and "idle_since" not in one
    assert two["confirm"] is True and two["consumer_count"] == 1
    assert two["messages_unacknowledged"] == 4
    assert nine["number"] == 9 and nine["messages_unacknowledged"] == 1
    assert one["connection_details"] == {"name": c["name"], "peer_host": "127.0.0.1",
                                         "peer_port": 5000}


def test_users_limits_come_whole_and_go_with_their_user() -> None:
    """The supervisor sends the users' limits as one table (broker.runtime.management_child);
    a deleted user's limits go with it."""
    users = Users({"ann": "x", "bob": "y"}, limits={"ann": {"max-channels": 1}})
    assert users.limits == {"ann": {"max-channels": 1}}
    users.apply({"user_limits": {"bob": {"max-connections": 2}}})
    assert users.limits == {"bob": {"max-connections": 2}}
    users.apply({"users": {}, "removed": ["bob"], "tags": {}})
    assert users.limits == {}


def test_the_users_pipe_carries_limits() -> None:
    """``[users, tags, user_limits]``; an older supervisor's ``[users, tags]`` has no limits."""
    for payload, limits in (([{"a": "h"}, {"a": ["x"]}, {"a": {"max-channels": 3}}],
                             {"a": {"max-channels": 3}}),
                            ([{"a": "h"}, {"a": ["x"]}], {})):
        r, w = os.pipe()
        os.write(w, json.dumps(payload).encode())
        os.close(w)
        assert read_users(r) == ({"a": "h"}, {"a": ["x"]}, limits)
