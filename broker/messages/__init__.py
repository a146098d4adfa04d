"""A message and what travels with it: body reference, routing headers, field tables,
dead-letter copies, index records."""
