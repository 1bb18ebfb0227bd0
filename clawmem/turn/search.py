"""The search of sealed text: SQL cannot match titles and contents it cannot read, so a search
of an encrypted site decrypts the newest titles and messages and looks in them, bounded, and
says how far it looked. Export and erasure scan everything instead."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from clawmem.crypto import Cipher, Context
from clawmem.errors import Undecryptable
from clawmem.sql import conversation_list as listing
from clawmem.sql import sealing
from clawmem.sql.engine import connect

# How many of the newest conversations (titles) and messages a search of sealed text decrypts
# and scans: SQL cannot match text it cannot read. Export and erasure scan everything instead.
SCAN_LIMIT = 10_000


@dataclass(frozen=True)
class TextScan:
    """What a search of sealed text found and how far it looked: the matching conversations
    with the start of their newest matching message (``None`` when only the title matched),
    how many titles and messages were decrypted, and whether that was every one of them."""

    matches: dict[str, str | None]
    conversations_read: int
    messages_read: int
    complete: bool


class SealedSearch:
    """The bounded search of one site's sealed conversations (``prefix``), with its last scan
    kept for a moment, so that a page's list, count and snippets cost one scan."""

    def __init__(self, engine: Engine, prefix: str, cipher: Cipher) -> None:
        self.engine = engine
        self.prefix = prefix
        self.cipher = cipher
        self._last: tuple[Any, TextScan] | None = None

    def scan(self, query: str, limit: int = SCAN_LIMIT, **filters: Any) -> TextScan:
        """Return which conversations passing ``filters`` hold ``query`` (case-insensitive) in
        their title or a message, decrypting the newest ``limit`` titles and messages."""
        # Kept for a moment only (one page's list, count and snippets), so a later search sees
        # what was written since, and only while nothing was erased anywhere.
        self.cipher.check_erasures()
        memo = (
            query,
            limit,
            tuple(sorted(filters.items(), key=lambda item: item[0])),
            int(time.monotonic()),
            self.cipher.forgotten,
        )
        if self._last is not None and self._last[0] == memo:
            return self._last[1]
        needle = query.casefold()
        with connect(self.engine) as conn:
            titles, contents = listing.scan_candidates(conn, self.prefix, limit + 1, **filters)
        complete = len(titles) <= limit and len(contents) <= limit
        titles, contents = titles[:limit], contents[:limit]
        matches: dict[str, str | None] = {}
        for conversation_id, message_id, content in reversed(contents):  # oldest first: the first match wins
            text = self._opened_text(sealing.MESSAGES, message_id, "content", content)
            if text is not None and needle in text.casefold() and matches.get(conversation_id) is None:
                matches[conversation_id] = text
        for conversation_id, title in titles:
            text = self._opened_text(sealing.CONVERSATIONS, conversation_id, "title", title)
            if text is not None and needle in text.casefold():
                matches.setdefault(conversation_id, None)
        found = TextScan(matches, len(titles), len(contents), complete)
        self._last = (memo, found)
        return found

    def last_matches(
        self, conversation_ids: Sequence[str], query: str, max_chars: int
    ) -> dict[str, str] | None:
        """Return, by conversation id, the start of the first matching message of each of
        ``conversation_ids`` as the last scan of ``query`` found it, or ``None`` when there is
        no such scan (or something was erased anywhere since)."""
        self.cipher.check_erasures()  # the last scan's matches serve only while nothing was erased
        last = self._last
        if last is None or last[0][0] != query or last[0][-1] != self.cipher.forgotten:
            return None
        matches = last[1].matches
        return {
            conversation_id: (matches[conversation_id] or "")[:max_chars]
            for conversation_id in conversation_ids
            if matches.get(conversation_id) is not None
        }

    def _opened_text(self, table: str, row_id: str, column: str, text: Any) -> str | None:
        if text is None:
            return None
        try:
            return self.cipher.open(str(text), Context.row(self.prefix, table, row_id, column))
        except Undecryptable:
            return None  # an unreadable row matches nothing; its page marks it
