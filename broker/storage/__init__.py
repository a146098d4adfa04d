"""What is kept on disk: the data directory, definitions, the message index, paged-out bodies."""
