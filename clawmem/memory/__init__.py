"""The key/value memory: one contract (:mod:`~clawmem.memory.base`), its drivers (array, file,
Redis, SQL) with their change feeds and vector stores, the wrappers (router, privacy switch),
embedding on write, and the registry that opens a driver from settings.

It may import recall (drivers feed its indexes), encryption, sql, crypto and the ground floor;
the turn and everything above import it.
"""
