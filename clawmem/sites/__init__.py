"""One site (one ``CLAW_TABLE_PREFIX``) and what an operator runs on it: the site opened once from
its settings (:mod:`~clawmem.sites.site`), forgetting, flushing, sweeping, retention, init-db,
stats and uninstall (:mod:`~clawmem.sites.operations`), the batches every deletion shares, and
key rotation.

It may import the turn and every floor below it; a person's data (:mod:`clawmem.privacy`), the
queue and the entrances stand above it.
"""
