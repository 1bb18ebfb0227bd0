"""One turn, from a message to its stored reply: the pipeline (:class:`~clawmem.turn.pipeline.Claw`),
the conversation log it reads and appends, compaction, the PII guards, skills, and the memory
the conversation writes (the ``remember`` tool, extraction).

It may import the floors below it (memory, recall, providers, encryption, sql, crypto and the
ground floor); the site, the operations, the queue and the entrances stand above it.
"""
