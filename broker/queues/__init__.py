"""Queues: the entry list, the QueueConsumerManager, consumer modes, queue arguments."""

from ipc.compiled import sources_only

sources_only(__path__)
