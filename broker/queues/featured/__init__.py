"""Queues with what the plain queue leaves out: TTL, length limits, priorities, groups,
delivery limits."""
