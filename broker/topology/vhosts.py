"""The broker's virtual hosts, by name, and the one each connection opened (RabbitMQ's vhosts).

Each :class:`~broker.topology.vhost.VirtualHost` has its own exchanges (the default and ``amq.*``
ones included), queues, bindings, policies and exclusive queues: a queue ``q`` of vhost ``a``
and one of ``b`` are two queues, and a publish, consume or binding of a connection reaches the
objects of the vhost it opened only (:meth:`VirtualHosts.of`). What a broker has one of is
shared by all of them: the bounded step's sliced work (so one step's budgets hold however many
vhosts there are), the clock, and the index journal of persistent messages, whose records name
a queue with its vhost (:func:`broker.messages.message_journal.queue_key`).

A vhost deleted (rabbitmqctl delete_vhost) takes everything in it along: its queues are deleted
as queue.delete would (their consumers to cancel are returned), and a connection still on it
gets ``320 CONNECTION_FORCED - vhost 'V' is deleted`` for any request in flight, as its worker
closes it with those words (rabbit_vhost:delete, rabbit_connection_tracking_handler).

Called from: the supervisor process (``broker.runtime.dispatch`` and the runtime's parts).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

from broker.errors import ConnectionForced
from broker.messages.message import Message
from broker.messages.message_journal import DEFAULT_VHOST, MessageJournal
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.graveyard import REAP, Graveyard
from broker.queues.queue import Queue
from broker.queues.queue_host import REAP_SLICE, BodyCodec
from broker.queues.sliced_work import SlicedWork
from broker.topology.definitions import TopologyJournal
from broker.topology.step_host import TickOutcome
from broker.topology.vhost import VirtualHost

__all__ = ["DEFAULT_DESCRIPTION", "DEFAULT_VHOST", "VirtualHosts"]

DEFAULT_DESCRIPTION = "Default virtual host"  # RabbitMQ's, of the "/" a new node makes


def deleted_text(name: str) -> str:
    """RabbitMQ's reason for closing a deleted vhost's connections (rabbit_vhost)."""
    return f"vhost '{name}' is deleted"


class VirtualHosts:
    """Every vhost of the broker, what they share, and which vhost each connection is on."""

    def __init__(self, on_drop: Callable[[Message], None] | None, *, now: float = 0.0,
                 epoch_offset: float = 0.0, body_codec: BodyCodec | None = None) -> None:
        self._on_drop = on_drop
        self.now = now
        self.epoch_offset = epoch_offset
        self.body_codec = body_codec
        self.sliced = SlicedWork(**{REAP: REAP_SLICE})
        self.by_name: dict[str, VirtualHost] = {}
        # connection key (the runtime's (worker, conn)) -> the vhost it opened; a deleted
        # vhost's stay until the connection closes, so that its requests get 320.
        self._conns: dict[Hashable, VirtualHost] = {}
        self._messages: MessageJournal | None = None
        # Durable topology is journalled (shoal serve --data-dir): each new vhost's too.
        self.keep_topology = False

    # ------------------------------------------------------------ the set

    def __iter__(self) -> Iterator[VirtualHost]:
        return iter(list(self.by_name.values()))

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> VirtualHost | None:
        return self.by_name.get(name)

    def add(self, name: str) -> VirtualHost:
        """A new, empty vhost (its standard exchanges only); the existing one if there is."""
        found = self.by_name.get(name)
        if found is not None:
            return found
        vhost = VirtualHost(name, on_drop=self._on_drop, now=self.now,
                            epoch_offset=self.epoch_offset, sliced=self.sliced)
        vhost.body_codec = self.body_codec
        vhost.messages = self._messages
        if self.keep_topology:
            vhost.journal = TopologyJournal()
        self.by_name[name] = vhost
        return vhost

    def remove(self, name: str) -> list[QueueConsumer]:
        """Delete vhost ``name`` and everything in it: its queues go as queue.delete takes
        them (index records say so); returns their consumers, to cancel. Its durable
        definitions are the caller's to remove (one statement, not a change per object)."""
        return self.by_name.pop(name).delete_all()

    # ------------------------------------------------------------ connections

    def opened(self, owner: Hashable, name: str) -> None:
        """Connection ``owner`` opened vhost ``name`` (its worker checked it exists)."""
        vhost = self.by_name.get(name)
        if vhost is None:  # deleted while the open was in flight: its requests get 320
            vhost = VirtualHost(name, sliced=self.sliced)
            vhost.deleted = True
        self._conns[owner] = vhost

    def closed(self, owner: Hashable) -> None:
        self._conns.pop(owner, None)

    def worker_gone(self, worker: int) -> None:
        for key in [k for k in self._conns if isinstance(k, tuple) and k[0] == worker]:
            del self._conns[key]

    def of(self, worker: int, conn: int) -> VirtualHost:
        """The vhost connection ``conn`` of ``worker`` opened ("/" for one that said nothing:
        a test's); 320 when it has been deleted."""
        vhost = self._conns.get((worker, conn))
        if vhost is None:
            return self.by_name[DEFAULT_VHOST]
        if vhost.deleted:
            raise ConnectionForced(deleted_text(vhost.name))
        return vhost

    def vhost_of_conn(self, owner: Hashable) -> VirtualHost | None:
        """The vhost ``owner`` opened, even a deleted one (teardown); None: unknown."""
        return self._conns.get(owner, self.by_name.get(DEFAULT_VHOST))

    def host_of(self, queue: Queue) -> VirtualHost | None:
        """The live vhost ``queue`` belongs to (None: it went with its vhost)."""
        vhost = self.by_name.get(queue.vhost)
        return vhost if vhost is not None and vhost.queues.get(queue.name) is queue else None

    def remove_consumer(self, queue: Queue, consumer: QueueConsumer) -> list[QueueConsumer]:
        """Detach a consumer from its queue, through the queue's vhost (auto-delete)."""
        vhost = self.host_of(queue)
        if vhost is None:
            return queue.remove_consumer(consumer) if not queue.deleted else []
        return vhost.remove_consumer(queue, consumer)

    # ------------------------------------------------------------ what they share

    @property
    def messages(self) -> MessageJournal | None:
        """The index journal every vhost's durable queues write to (None: no data directory)."""
        return self._messages

    @messages.setter
    def messages(self, journal: MessageJournal | None) -> None:
        self._messages = journal
        for vhost in self.by_name.values():
            vhost.messages = journal

    def queues(self) -> Iterator[Queue]:
        """Every queue of every vhost."""
        for vhost in list(self.by_name.values()):
            yield from vhost.queues.values()

    def buried_body_refs(self) -> Iterator[Any]:
        """Body handles of purged and deleted queues' entries not dropped yet, every vhost's
        (they share one graveyard line)."""
        return Graveyard(self.sliced).body_refs()

    def discard(self, container: list[Any] | dict[Any, Any]) -> None:
        """Deallocate a container let go of, a slice per step (StepHost.discard)."""
        Graveyard(self.sliced).discard(container)
        self.sliced.run(REAP)

    def advance(self, now: float) -> None:
        self.now = max(self.now, now)
        for vhost in self.by_name.values():
            vhost.advance(now)

    def drain(self, *, whole: bool = False) -> list[QueueConsumer]:
        """Route each vhost's pending dead letters (StepHost.drain)."""
        woken: list[QueueConsumer] = []
        for vhost in list(self.by_name.values()):
            woken += vhost.drain(whole=whole)
        return woken

    def tick(self, now: float) -> TickOutcome:
        """Each vhost's timer step (StepHost.tick), the outcomes joined; the graveyard they
        share gets one slice for the tick, not one per vhost."""
        self.advance(now)  # each vhost's clock and budgets: none refills the graveyard's after
        self.sliced.refill(REAP)
        notify: list[QueueConsumer] = []
        deleted: list[str] = []
        cancelled: list[QueueConsumer] = []
        dead_lettered = 0
        for vhost in list(self.by_name.values()):
            outcome = vhost.tick(now, refill=False)
            notify += outcome.notify
            deleted += outcome.deleted_queues
            cancelled += outcome.cancelled
            dead_lettered += outcome.dead_lettered
        if not self.by_name and self.sliced:  # no vhost left: the shared line still runs
            self.sliced.run(REAP)
        return TickOutcome(notify, deleted, cancelled, dead_lettered)

    def next_deadline(self) -> float | None:
        """The earliest of the vhosts' deadlines; ``now`` while shared work is left."""
        if self.sliced:
            return self.now
        deadlines = [d for v in self.by_name.values() if (d := v.next_deadline()) is not None]
        return min(deadlines, default=None)
