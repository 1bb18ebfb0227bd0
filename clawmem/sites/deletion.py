"""What the deleting operations share: the :class:`Deleted` result and conversations deleted in
batches, each batch one transaction, messages first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawmem.sites.site import Site
from clawmem.sql.engine import connect
from clawmem.sql.retention import Batch, count_conversations, delete_in_batches

OnBatch = Callable[[Batch], None]


@dataclass(frozen=True)
class Deleted:
    """What an operation deleted or, with ``dry_run``, would delete.

    ``entries`` lists the (namespace, key) pairs of key/value entries; conversation ids are
    reported per batch to ``on_batch``, so a large run never holds them all.
    """

    dry_run: bool
    conversations: int = 0
    messages: int = 0
    entries: tuple[tuple[str, str], ...] = ()
    batches: int = 0
    mentions_left: int = 0  # mentions of the subject elsewhere, listed but not deleted
    subject_keys: int = 0  # the subject's data keys deleted from the key store (crypto-erasure)

    def counts(self) -> dict[str, int]:
        """Return the counts for an audit line: conversations, messages and memory entries."""
        return {"conversations": self.conversations, "messages": self.messages, "memory": len(self.entries)}

    @property
    def nothing(self) -> bool:
        """Return whether the operation found nothing to delete."""
        return not (self.conversations or self.messages or self.entries)


def delete_conversations(
    site: Site, where: Any, by: str, batch_size: int, dry_run: bool, on_batch: OnBatch | None
) -> Deleted:
    """Delete the conversations matching ``where`` (oldest ``by`` first) with their messages,
    ``batch_size`` per transaction, telling ``on_batch`` of each committed batch; with
    ``dry_run`` only count them."""
    if dry_run:
        with connect(site.engine) as conn:
            counts = count_conversations(conn, site.prefix, where)
        return Deleted(True, conversations=counts.conversations, messages=counts.messages)
    conversations = messages = batches = 0
    for batch in delete_in_batches(site.engine, site.prefix, where, order_by=by, batch_size=batch_size):
        conversations += batch.conversations
        messages += batch.messages
        batches += 1
        if on_batch is not None:
            on_batch(batch)
    return Deleted(False, conversations=conversations, messages=messages, batches=batches)
