"""What the supervisor keeps on disk (``shoal serve --data-dir DIR``), as one object.

:class:`Durability` owns the data directory's lock, the definitions store and the queue index;
the supervisor calls it at four moments:

* :meth:`recover_definitions` at start, before any region exists: durable topology comes back;
* :meth:`recover_messages` once the regions exist, before any worker runs: persistent messages
  come back (into the arenas, or paged out), the index files stay and a new one is begun,
  unneeded body segments go;
* :meth:`save` before every flush of events to the workers: the batch's definition changes are
  committed (fsync), so no reply precedes what it reports;
* :meth:`sync_index` (a task): group commit of the index. Each sync first writes every index
  record made since the previous one began (one write; the records of a message that went in
  the meantime cancel out and are not written, ``broker.messages.message_journal``), then fsyncs off the
  event loop; after it, the publisher confirms held for it go out.

Layout and what each file holds: ``broker.storage.data_dir``, ``broker.storage.definition_store``,
``broker.storage.message_store``, ``ipc.logfile``.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from broker.messages.message import Message
from broker.messages.message_journal import DEFAULT_VHOST, MessageJournal, split_key
from broker.passwords import users_at_start
from broker.permissions import FULL
from broker.runtime.dispatch import Dispatcher
from broker.runtime.policies import load_policies
from broker.storage.data_dir import DataDir
from broker.storage.definition_store import DefinitionStore, Opened, open_definitions, restore
from broker.storage.index_moves import move_oldest
from broker.storage.message_store import (
    INDEX_DIR,
    ArenasFull,
    IndexLog,
    IndexState,
    Restored,
    SetAside,
    cut_torn_tail,
    index_files,
    load_index,
    set_aside,
)
from broker.storage.message_store import restore as restore_messages
from broker.topology.definitions import TopologyJournal
from broker.topology.vhosts import DEFAULT_DESCRIPTION, VirtualHosts
from ipc.logfile import CpuSaturation, remove_segment, sync_files, sync_pause, write_all
from ipc.logfile import segments as body_segments

log = logging.getLogger("shoal.supervisor")

# Free-space checks (one statvfs each) come as RabbitMQ's rabbit_disk_monitor spaces them:
# twice the time the room above the limit would take to fill at DISK_FILL_RATE, between
# DISK_CHECK_MIN and DISK_CHECK_MAX seconds (10 s with gigabytes to spare, 0.1 s close to the
# limit). Under the alarm, every DISK_CHECK_ALARMED s (RabbitMQ: every 10 s): publishers
# resume within a second of the space coming back.
DISK_CHECK_MIN = 0.1
DISK_CHECK_MAX = 10.0
DISK_CHECK_ALARMED = 1.0
DISK_FILL_RATE = 250e6  # bytes a second (RabbitMQ's ?FAST_RATE)
CLEAN_STOP = "clean-stop"  # in DIR/index/ from an orderly stop until the next start


def disk_check_interval(free: int, limit: int, alarmed: bool) -> float:
    """Seconds to the next free-space check (rabbit_disk_monitor's interval/1, but a second
    under the alarm)."""
    if alarmed:
        return DISK_CHECK_ALARMED
    return min(max(2 * (free - limit) / DISK_FILL_RATE, DISK_CHECK_MIN), DISK_CHECK_MAX)


class Durability:
    """The supervisor's data directory: definitions, the queue index, body segment clean-up."""

    def __init__(self, path: str, dispatcher: Dispatcher) -> None:
        self.data = DataDir(path)
        self.path = self.data.path
        self.dispatcher = dispatcher
        self.definitions: DefinitionStore | None = None
        self._opened: Opened | None = None
        self.index: IndexLog | None = None
        self._sync_bell = trio.Event()
        self.default_vhost = DEFAULT_VHOST  # where the users added at a first start get permissions
        self.saturated = CpuSaturation()  # whether a busy sync's successor waits (ipc.logfile)

    def recover_definitions(self, default_vhost: str = DEFAULT_VHOST) -> None:
        """Open the definitions (``broker.storage.definition_store.open_definitions``: refused with
        DataDirDamaged, nothing changed, when they cannot be this directory's) and declare them.
        A new directory's one vhost is ``default_vhost`` (RabbitMQ's default_vhost: read at the
        first start only, so a directory already initialised keeps its vhosts)."""
        started = time.monotonic()
        opened = open_definitions(self.data)
        self.definitions, self._opened = opened.store, opened
        self.default_vhost = default_vhost
        if opened.new and default_vhost != DEFAULT_VHOST:  # "/" is then not made, as RabbitMQ
            opened.store.delete_vhost(DEFAULT_VHOST)
            opened.store.put_vhost(default_vhost, DEFAULT_DESCRIPTION)
        opened.store.checkpoint_off_loop(trio.lowlevel.start_thread_soon)
        if opened.behind:
            log.error("data directory %s: %s is %d change batch(es) behind what was committed to "
                      "it (%s says generation %d, it holds %d): the latest declares, deletes or "
                      "bindings were lost (a damaged WAL, or a copy restored from a backup); "
                      "queues whose definition went are not restored",
                      self.path, self.data.definitions, opened.behind, self.data.generation,
                      opened.store.generation + opened.behind, opened.store.generation)
        d, store = self.dispatcher, self.definitions
        stored = {row["name"]: row for row in store.vhosts()}
        policies = store.policies()
        counts = [0, 0, 0]
        skipped: list[str] = []
        for name, row in stored.items():
            vhost, _ = d.add_vhost(name, row["description"], row["tags"], row["default_queue_type"])
            skipped += load_policies(vhost, policies)  # before the queues
            defs = store.load(name)
            skipped += restore(vhost, defs)
            vhost.journal = TopologyJournal()
            counts = [counts[0] + len(defs.exchanges), counts[1] + len(defs.queues),
                      counts[2] + len(defs.bindings)]
        d.vhosts.keep_topology = True  # a vhost added from now on journals its changes too
        log.info("data directory %s: restored %d exchange(s), %d queue(s), %d binding(s)%s in "
                 "%d vhost(s) in %.0f ms", self.path, *counts,
                 f" ({len(skipped)} skipped)" if skipped else "", len(stored),
                 (time.monotonic() - started) * 1e3)

    def recover_users(self, given: dict[str, str],
                      permissions: tuple[str, str, str] = FULL) -> dict[str, str]:
        """Who may log in (``broker.passwords.users_at_start``): the stored users, with those
        ``given`` at this start added or given their new password (written before any worker
        starts), a new one with ``permissions`` on the default vhost. Name -> stored password."""
        assert self.definitions is not None and self._opened is not None
        stored = self.definitions.users()
        users, changes = users_at_start(stored, given, self._opened.new)
        if changes:
            self.definitions.put_users(changes)
        for name in changes:  # RabbitMQ's default user, and those given at a start: its
            if name not in stored:  # default_permissions (full unless told)
                self.definitions.put_permissions(name, self.default_vhost, permissions)
        for name in changes:
            log.info("data directory %s: user '%s' %s", self.path, name,
                     "has a new password" if name in stored else "added")
        if not self._opened.marked:  # the first start is done: from now on never a new directory
            self.data.write_marker(self.definitions.node)
            log.info("data directory %s: %s node %s", self.path,
                     "initialised as" if self._opened.new else "adopted, as", self.definitions.node)
        if not users:
            log.warning("data directory %s: no users stored and none given: nobody can log in "
                        "(start with --user NAME:PASSWORD)", self.path)
            return {}
        return users

    def recover_messages(self, arenas: list[Any], arena_mb: int) -> None:
        """Persistent messages back onto their durable queues. With paging (``broker.storage.paging``)
        their bodies stay on disk until delivered; without, they go into ``arenas`` (worker k's
        is ``arenas[k]``), and ArenasFull is raised when they do not fit.

        A restore makes millions of objects that all live on: the cyclic garbage collector
        would scan the growing heap again and again, for nothing. It is off meanwhile, and what
        was restored is then frozen out of later collections (still freed by reference counting;
        the figures are perf/README.md's, R1)."""
        gc.disable()
        try:
            self._recover_messages(arenas, arena_mb)
        finally:
            gc.freeze()
            gc.enable()

    def _recover_messages(self, arenas: list[Any], arena_mb: int) -> None:
        started = time.monotonic()
        d = self.dispatcher
        vhosts = d.vhosts
        sizes = self._stopped_cleanly()
        clean = sizes is not None
        state = load_index(self.path, clean=clean, sizes=sizes)
        _report_index(state, clean)
        journal = MessageJournal(last_id=state.max_id, epoch_offset=vhosts.epoch_offset)
        vhosts.messages = journal  # every vhost's durable queues write their records there
        self.index = IndexLog(self.path)
        journal.index_file = self.index.number  # what changes from here on is written there
        try:
            restored = restore_messages(state, journal, self.path, arenas,
                                        partial(_place, vhosts), lazy=bool(d.pager.high))
        except ArenasFull as exc:
            raise ArenasFull(f"{exc} ({len(arenas)} x {arena_mb} MiB): start with a larger "
                             "--arena-mb (or more --workers)") from None
        for k, held in enumerate(restored.per_arena):
            d.region_bytes[k] += held
        for message in restored.dropped:  # no queue took it (refused, expired, queue gone)
            d.drop_unqueued(message)
        d.end_batch()  # dead letters made on the way (TTL passed while down)
        _report_lost(restored, clean)
        live = journal.live_segments()
        unneeded = [(worker, segment) for worker in range(len(arenas))
                    for segment in body_segments(self.path, worker) if (worker, segment) not in live]
        # After damage, a segment no record names may hold bodies whose E records were lost.
        damaged = any(not x.torn for x in state.damage)
        aside = set_aside(self.path, state, set(restored.gone), unneeded if damaged else [])
        _report_aside(aside, restored.gone, self.path)
        for name in restored.gone:  # set aside: no later start, nor queue of that name, gets them
            journal.deleted(name)
        records = journal.take()
        if not clean:  # every message restored may have been delivered, at later starts too
            records.insert(0, ("U",))
        self.index.start(records, journal.mark, state.files)
        cut_torn_tail(state)
        removed = 0
        if not damaged:
            for worker, segment in unneeded:
                remove_segment(self.path, worker, segment)
                removed += 1
        log.info("data directory %s: restored %d persistent message(s) (%d bodies, %.1f MiB, in "
                 "the arenas; %d paged out) from %d index record(s)%s%s; %d unneeded body "
                 "segment(s) removed, in %.0f ms",
                 self.path, restored.messages, restored.bodies, restored.bytes / (1 << 20),
                 restored.paged, state.records,
                 f", {sum(restored.lost.values())} lost" if restored.lost else "",
                 "" if clean else " (after an unclean stop: every one redelivered)",
                 removed, (time.monotonic() - started) * 1e3)

    def _stopped_cleanly(self) -> dict[str, int] | None:
        """The index files' sizes at the last run's clean stop, or None if it did not stop
        cleanly (no marker, or index files it does not name). The marker goes at once, and
        durably: a crash from here on is an unclean stop."""
        marker = self.path / INDEX_DIR / CLEAN_STOP
        try:
            said = marker.read_text()
        except (FileNotFoundError, UnicodeDecodeError):
            return None
        sizes: dict[str, int] = {}
        for line in said.splitlines():
            name, _, size = line.partition(" ")
            if size.isdigit():
                sizes[name] = int(size)
        marker.unlink()
        _sync_dir(self.path / INDEX_DIR)
        if any(p.name not in sizes for p in index_files(self.path / INDEX_DIR)):
            return None
        return sizes

    def stopped_cleanly(self) -> None:
        """The stop is orderly and the index synced (every record made is on disk): leave the
        marker that tells the next start its D records are exact and no tail is torn."""
        index, journal = self.index, self.dispatcher.vhosts.messages
        if index is None or journal is None or index.unsynced or journal.mark > index.written:
            return
        marker = self.path / INDEX_DIR / CLEAN_STOP
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, [_index_summary(self.path).encode()])
            os.fsync(fd)
        finally:
            os.close(fd)
        _sync_dir(self.path / INDEX_DIR)

    def save(self) -> None:
        """Before a flush: commit the batch's definition changes, ring the index sync if the
        batch made index records, remove the files nothing needs."""
        vhosts = self.dispatcher.vhosts
        for vhost in vhosts:
            topology = vhost.journal
            if topology is not None and topology.changes and self.definitions is not None:
                changes = topology.take()
                try:
                    self.definitions.apply(changes, vhost.name)
                except Exception:  # a full or failing disk: the broker goes on, the change is not kept
                    log.exception("data directory: %d definition change(s) not saved", len(changes))
        journal, index = vhosts.messages, self.index
        if journal is None or index is None:
            return
        if journal.mark > index.written:
            self._sync_bell.set()
        if index.remove_unneeded(journal.index_file_needed):
            self._sync_bell.set()  # the directory changed
        while journal.segments_free:
            worker, segment = journal.segments_free.pop()
            remove_segment(self.path, worker, segment)

    async def sync_index(self, flush: Callable[[], object]) -> None:
        """Group commit: sync the index whenever it has unsynced records (all that arrived while
        the previous sync ran, at once), off the event loop; then release the held confirms and
        ``flush`` them out. Under load the next sync waits a little (ipc.logfile.sync_pause)."""
        while True:
            await self._sync_bell.wait()
            self._sync_bell = trio.Event()
            index = self.index
            while index is not None:
                before, began = index.synced, trio.current_time()
                if not await self.sync_once():
                    break
                flush()  # the confirms it released, before the next sync
                pause = sync_pause(index.synced - before, trio.current_time() - began, self.saturated)
                if pause:  # under load: the next sync covers more
                    await trio.sleep(pause)

    def write_index(self) -> None:
        """Write the index records made since the last write (what cancelled out is left out),
        then begin the next index file if this one is full. Both in one step of the event
        loop: every record made later counts in, and goes to, the file begun here."""
        vhosts = self.dispatcher.vhosts
        journal, index = vhosts.messages, self.index
        if journal is None or index is None:
            return
        if journal.mark > index.written:
            index.append(journal.take(), journal.mark)
        if index.rotate():  # the newest file is full: records go to the next one
            journal.index_file = index.number
            moved = move_oldest(vhosts, journal, index.files, vhosts.now)
            if moved:
                log.info("index: %d live message record(s) moved out of the oldest index file, "
                         "which goes once they are on disk", moved)
                index.append(journal.take(), journal.mark)

    async def sync_once(self) -> bool:
        """One sync of everything recorded so far; False if there was nothing to sync."""
        index = self.index
        if index is None:
            return False
        self.write_index()
        if not index.unsynced:
            return False
        mark, fds = index.sync_plan()
        if fds:
            await trio.to_thread.run_sync(sync_files, fds)
        index.synced_to(mark, fds)
        self.dispatcher.index_synced(mark)
        return True

    async def sync_now(self) -> None:
        while await self.sync_once():
            pass

    async def watch_disk(self, limit: int, flush: Callable[[], object]) -> None:
        """The disk alarm: publishers block while the data directory's free space is below
        ``limit`` bytes (RabbitMQ's disk_free_limit), checked as often as
        :func:`disk_check_interval` says."""
        while True:
            free = shutil.disk_usage(self.path).free
            active = free < limit
            if active != self.dispatcher.alarms.disk:
                if active:
                    log.warning("disk alarm set: free disk space %d bytes, below the limit %d. *** "
                                "Publishers will be blocked until this alarm clears ***", free, limit)
                else:
                    log.warning("disk alarm cleared: free disk space %d bytes, the limit is %d",
                                free, limit)
                self.dispatcher.set_disk_alarm(active)
                flush()
            await trio.sleep(disk_check_interval(free, limit, active))

    def close(self) -> None:
        if self.index is not None:
            self.index.close()
        if self.definitions is not None:
            self.definitions.close()
        self.data.close()


def _place(vhosts: VirtualHosts, key: str, message: Message, redelivered: bool,
           enqueued_at: float) -> bool:
    """A restored message onto the durable queue its index key names (message_journal.queue_key),
    in its vhost; False when there is no such queue (nor vhost)."""
    vhost_name, name = split_key(key)
    vhost = vhosts.get(vhost_name)
    return vhost is not None and vhost.restore_message(name, message, redelivered, enqueued_at)


def _named(key: str) -> str:
    """An index key (message_journal.queue_key) as a log names the queue: 'q', or 'q' in vhost 'v'."""
    vhost, name = split_key(key)
    return repr(name) if vhost == DEFAULT_VHOST else f"{name!r} in vhost {vhost!r}"


def _sync_dir(path: Any) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _index_summary(path: Any) -> str:
    """Each index file's name and size, a line each: what a clean-stop marker vouches for."""
    return "".join(f"{p.name} {p.stat().st_size}\n" for p in index_files(path / INDEX_DIR))


def _report_index(state: IndexState, clean: bool) -> None:
    """Torn tails at WARNING (never confirmed); damage at ERROR, with what it may have cost."""
    for line in state.torn:
        log.warning("index: %s (a torn tail: records after it were never confirmed)", line)
    for damage in state.damage:
        queues = ", ".join(_named(q) for q in sorted(damage.queues)) or "none"
        log.error("index: damaged: %s; the records after it are kept; messages enqueued before "
                  "it come back redelivered (their delivery or removal may have been recorded "
                  "there), on queue(s) %s", damage.describe(), queues)
    if state.orphans:
        per_queue: dict[str, int] = {}
        for name, _ in state.orphans:
            per_queue[name] = per_queue.get(name, 0) + 1
        log.error("index: %d message(s) named by records after the damage were never found: "
                  "their enqueue records were in it and they are lost (%s)", len(state.orphans),
                  ", ".join(f"{n} on queue {_named(q)}" for q, n in sorted(per_queue.items())))
    if not clean and state.files:
        log.info("index: the last run did not stop cleanly: every message restored comes back "
                 "redelivered (its delivery may not have been recorded)")


def _report_lost(restored: Restored, clean: bool) -> None:
    """Messages in the index whose bodies are not on disk: confirmed ones at ERROR. After an
    unclean stop a body past the end of its segment may not have been synced, and then its
    message was never confirmed."""
    for name, lost in sorted(restored.lost.items()):
        maybe = 0 if clean else restored.cut_short.get(name, 0)
        if lost > maybe:
            log.error("index: %d confirmed message(s) on queue %s lost: their bodies are "
                      "missing or damaged in the body segments", lost - maybe, _named(name))
        if maybe:
            log.warning("index: %d message(s) on queue %s lost: their bodies lie past the end "
                        "of their body segments (not yet synced at the unclean stop, so never "
                        "confirmed; or damage)", maybe, _named(name))


def _report_aside(aside: SetAside, gone: dict[str, int], path: Any) -> None:
    for name, count in sorted(gone.items()):
        log.error("index: queue %s is not in the definitions: its %d message(s) are not restored; "
                  "their index records and bodies are set aside in %s", _named(name), count,
                  aside.path)
    if aside.path is not None:
        log.error("data directory %s: set aside in %s: %d index file(s) copied, %d body "
                  "segment(s) copied, %d body segment(s) no known message needs moved (index "
                  "records were lost)", path, aside.path, aside.index_files,
                  aside.copied_segments, aside.moved_segments)
