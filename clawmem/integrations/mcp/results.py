"""What each tool of the MCP server returns: typed results, published as the tools' output schemas.

Every result carries the ``run_id`` of its call, the id its events were emitted under.
"""

from __future__ import annotations

from typing import Any

from clawmem.integrations import require

require("mcp", "mcp")

from pydantic import BaseModel, Field  # noqa: E402  (pydantic comes with the mcp SDK)

RUN_ID = "The id of this call's run context: every event the call emitted carries it."
EXPIRES_AT = "When the entry expires, in Unix seconds (UTC); null: never."


class Candidate(BaseModel):
    """One entry that shares a word with the message, and what recall did with it."""

    namespace: str
    key: str
    score: int = Field(description="How many distinct words of the message the entry holds.")
    matched: list[str] = Field(description="The message's words found in the entry.")
    status: str = Field(
        description="injected, truncated (the only line, cut to fit), cut_top_k or cut_byte_cap."
    )
    reason: str = Field(description="Why, in words.")
    bytes: int = Field(description="The size of the entry's whole injection line, in UTF-8 bytes.")


class Recalled(BaseModel):
    """What a turn would be given for one message."""

    text: str = Field(
        description="The augmented message exactly as a turn would send it: the memory block, then "
        "the message; the message unchanged when nothing was recalled."
    )
    lines: list[str] = Field(description="The injected memory lines (`- key: value`), in order.")
    injected: list[str] = Field(description="The keys of the injected lines, in order.")
    namespaces: list[str] = Field(description="The namespaces read: the subject's first, if any.")
    candidates: list[Candidate] = Field(
        description="The best-ranked candidates (at most 25), in rank order: score, then key."
    )
    candidates_total: int = Field(description="How many entries share at least one word with the message.")
    zero_overlap: int = Field(description="How many live entries share no word with the message.")
    bytes_used: int = Field(description="The size of the memory block, in UTF-8 bytes.")
    max_recall_bytes: int
    top_k: int
    run_id: str = Field(description=RUN_ID)


class Remembered(BaseModel):
    """A stored entry."""

    namespace: str
    key: str
    expires_at: int | None = Field(description=EXPIRES_AT)
    bytes: int | None = Field(description="The stored value's size in UTF-8 bytes (null: not reported).")
    run_id: str = Field(description=RUN_ID)


class Found(BaseModel):
    """The answer of ``get``: the live value, or ``found`` false."""

    found: bool = Field(description="Whether a live entry exists (its value may still be null).")
    namespace: str
    key: str
    value: Any = Field(default=None, description="The stored JSON value (null when not found).")
    expires_at: int | None = Field(default=None, description=EXPIRES_AT)
    run_id: str = Field(description=RUN_ID)


class Namespaces(BaseModel):
    """The namespaces that hold entries, and this server's own."""

    namespaces: list[str] = Field(description="Namespaces holding entries, sorted (within the scope).")
    recall_namespace: str = Field(description="The namespace recall reads.")
    subject_namespace: str | None = Field(description="The bound subject's namespace, if any.")
    home: str = Field(description="Where remember, get and search go without a namespace.")
    run_id: str = Field(description=RUN_ID)


class KeyInfo(BaseModel):
    """One live key of a listing."""

    key: str
    expires_at: int | None = Field(description=EXPIRES_AT)
    bytes: int = Field(description="The stored value's size in UTF-8 bytes.")
    updated_at: str | None = Field(description="When it was last written (ISO 8601, UTC), if kept.")


class KeysPage(BaseModel):
    """One page of a namespace's live keys, in key order."""

    namespace: str
    keys: list[KeyInfo]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null: the last page.")
    run_id: str = Field(description=RUN_ID)


class SearchHit(BaseModel):
    """One search result."""

    namespace: str
    key: str
    value: Any
    score: int = Field(description="How many distinct words of the query the entry holds.")


class Searched(BaseModel):
    """The entries that share the most words with a query, best first (score, then key)."""

    query: str
    namespace: str
    hits: list[SearchHit]
    run_id: str = Field(description=RUN_ID)
