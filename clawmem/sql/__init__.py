"""Every SQL statement of clawmem, and nothing else: the three tables in their two shapes, the
memory table, the change log its triggers keep, conversations, retention, sizes, the vectors
table, sealing and the SQL key store.

It imports only :mod:`clawmem.crypto` (the sealed envelope) and the ground floor; every floor
that reads or writes a table stands above it.
"""
