"""A message and what travels with it: its body reference, routing headers, field tables, dead-letter copies and index records."""
