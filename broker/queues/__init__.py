"""Queues: the entry list, the QueueConsumerManager, consumer modes, queue arguments."""
