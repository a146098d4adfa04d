"""A virtual host's topology: exchanges and routing, bindings, exclusive queues, definitions,
the stepped work it hosts."""

from ipc.compiled import sources_only

sources_only(__path__)
