"""The definitions importer's pure parts (broker.runtime.definitions_io): what a file's vhosts
ask of the broker."""

from __future__ import annotations

from broker.runtime.definitions_io import vhost_plan


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
