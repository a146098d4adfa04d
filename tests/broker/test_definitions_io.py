"""The definitions importer's pure parts (broker.runtime.definitions_io): what a file's vhosts
ask of the broker, and where a file's objects go when the broker has their vhost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.runtime.definitions_io import Importer, vhost_plan
from broker.runtime.dispatch import Dispatcher


def test_the_vhost_import_plan_adds_what_is_missing_once() -> None:
    """A file's vhosts: those here are left, the others are add_vhost requests (description and
    tags at the top or in RabbitMQ 3.10's ``metadata``), a vhost's ``limits`` kept aside."""
    plan = vhost_plan([
        {"name": "/", "limits": {"max-queues": 3}},
        {"name": "other", "metadata": {"description": "d", "tags": ["a", "b"]}},
        {"name": "third", "description": "t", "tags": "x,y"},
        {"name": "other"}, {"name": ""}], {"/"})
    assert plan.present == ["/"]
    assert plan.add == [{"name": "other", "description": "d", "tags": ["a", "b"]},
                        {"name": "third", "description": "t", "tags": ["x", "y"]}]
    assert plan.limits == {"/": {"max-queues": 3}}


def _fixture() -> dict[str, Any]:
    path = Path(__file__).parents[1] / "integration" / "fixtures" / "rabbitmq-3.10.8-definitions.json"
    return dict(json.loads(path.read_text()))


@pytest.mark.trio
async def test_objects_of_a_vhost_the_broker_has_go_into_it_and_a_missing_one_is_named() -> None:
    """RabbitMQ 3.10.8's export: the objects of its second vhost land in that vhost when the
    broker has it; without it they are named, never put into "/"."""
    body = _fixture()
    others = [q["name"] for q in body["queues"] if q["vhost"] == "other"]
    assert others
    d = Dispatcher(1, lambda region, offset: None)
    report = await Importer(d, lambda: None, None, None, None, None).run(body)
    assert any("vhost 'other'" in line for line in report.unsupported)
    assert not set(others) & set(d.vhosts.by_name["/"].queues)

    d = Dispatcher(1, lambda region, offset: None)
    d.vhosts.add("other")
    report = await Importer(d, lambda: None, None, None, None, None).run(body)
    assert not any("vhost 'other'" in line for line in report.unsupported), report.unsupported
    assert set(others) <= set(d.vhosts.by_name["other"].queues)
    assert not set(others) & set(d.vhosts.by_name["/"].queues)
