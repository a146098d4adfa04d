"""A virtual host's topology: exchanges and routing, bindings, exclusive queues, definitions,
the stepped work it hosts."""
