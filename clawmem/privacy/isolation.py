"""Whether one site's stores see another site's data: where each driver keeps a site, and a
live check that reads another site's entries and conversations through this site's stores.

The rule (SPEC 4.2): a store opened for one site never reads, writes, sweeps or deletes another
site's data, on any driver. SQL keeps sites apart by table prefix, Redis by the key prefix
``{table prefix}phpclaw:``, files by a subdirectory of ``CLAW_FILE_DIR`` per site, and the array
driver by a store per site in the process's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clawmem.errors import InvalidNamespace, redact
from clawmem.memory.file import site_directory
from clawmem.records import MemoryRow
from clawmem.rules import validate_namespace
from clawmem.sites.site import Site
from clawmem.sql.sizes import present_tables, table_names

SAMPLE_NAMESPACES = 20  # of the other site's namespaces, the first by name
SAMPLE_KEYS = 25  # of each of those namespaces, the first by key
SAMPLE_CONVERSATIONS = 50  # of the other site's conversations, the newest

# How each memory driver keeps sites apart, in the words the Sites page shows.
DRIVER_RULES = {
    "sql": "one set of three tables per site, named by the table prefix "
    "(wp_phpclaw_memory, wp_2_phpclaw_memory)",
    "redis": "one key prefix per site, {table prefix}phpclaw:, under which every key of the site lies; "
    "no key of one prefix can be read as another's",
    "file": "one subdirectory of CLAW_FILE_DIR per site (site-wp_ for wp_, default-site for no prefix)",
    "array": "one store per site in the process's memory, gone when the process ends",
}


def memory_location(site: Site) -> str:
    """Return where the site's memory driver keeps its entries, in words (passwords hidden):
    the table, the Redis key prefix and server, the directory, or the process's memory."""
    settings = site.settings
    driver = settings.memory_driver
    if driver == "sql":
        return f"table {site.prefix}phpclaw_memory in {redact(settings.database_url)}"
    if driver == "redis":
        return f"Redis keys starting {site.prefix}phpclaw: on {redact(settings.redis_url)}"
    if driver == "file":
        return f"directory {site_directory(settings.file_dir, site.prefix)}"
    if driver == "array":
        return f"this process's memory (a store of its own for prefix {site.prefix!r})"
    return f"the {driver} driver's own store"


def is_namespace(name: str) -> bool:
    """Return whether ``name`` is a namespace today's rules accept (another program's rows may
    lie under any text, which the key/value reads refuse)."""
    try:
        validate_namespace(name)
    except InvalidNamespace:
        return False
    return True


def _same(mine: MemoryRow, theirs: MemoryRow) -> bool:
    # The same stored row read twice agrees on everything it holds; two sites that merely share
    # a key (both have "returns-policy") differ in their write times or values.
    return (mine.value, mine.expires_at, mine.created_at, mine.updated_at) == (
        theirs.value,
        theirs.expires_at,
        theirs.created_at,
        theirs.updated_at,
    )


def _timed(row: MemoryRow) -> bool:
    return row.created_at is not None or row.updated_at is not None


@dataclass(frozen=True)
class Separation:
    """What this site's stores saw of another site's data: the entries and conversations read
    there and looked up here, those found here too (``seen_*``: expected none), and whether the
    two sites' memory or tables lie in one place (``shared_place``).

    A driver that keeps no write times (file, Redis) cannot tell one shared row from two sites
    holding the same key and value: such rows are ``alike_entries``, shown but no failure (the
    distinct places are what keep those sites apart)."""

    other_prefix: str
    place: str
    other_place: str
    entries_checked: int
    conversations_checked: int
    seen_entries: list[tuple[str, str]] = field(default_factory=list)
    seen_conversations: list[str] = field(default_factory=list)
    alike_entries: list[tuple[str, str]] = field(default_factory=list)

    @property
    def shared_place(self) -> bool:
        """Return whether both sites' memory is kept in the very same place."""
        return self.place == self.other_place

    @property
    def apart(self) -> bool:
        """Return whether this site saw nothing of the other's and keeps its memory elsewhere."""
        return not (self.shared_place or self.seen_entries or self.seen_conversations)


def check_separation(this: Site, other: Site) -> Separation:
    """Read a sample of ``other``'s memory entries (the first :data:`SAMPLE_KEYS` keys of its
    first :data:`SAMPLE_NAMESPACES` namespaces) and its :data:`SAMPLE_CONVERSATIONS` newest
    conversations, and look each up through ``this`` site's stores; return the
    :class:`Separation` found. Storage errors propagate as the stores raise them."""
    seen_entries: list[tuple[str, str]] = []
    alike_entries: list[tuple[str, str]] = []
    entries_checked = 0
    # A configured site whose tables are not made yet holds nothing there to be seen.
    present = set(present_tables(other.engine, other.prefix))
    conversations_table, _, memory_table = table_names(other.prefix)
    has_memory = other.settings.memory_driver != "sql" or memory_table in present
    names = sorted(other.driver.namespaces()) if has_memory else []
    readable = [name for name in names if is_namespace(name)]
    for namespace in readable[:SAMPLE_NAMESPACES]:
        rows = other.driver.entries(namespace, limit=SAMPLE_KEYS).items
        if not rows:
            continue
        entries_checked += len(rows)
        found = this.driver.fetch(namespace, [row.key for row in rows])
        for row in rows:
            if row.key in found and _same(found[row.key], row):
                (seen_entries if _timed(row) else alike_entries).append((namespace, row.key))
    theirs = (
        [conversation.id for conversation in other.conversations.list(limit=SAMPLE_CONVERSATIONS).items]
        if conversations_table in present
        else []
    )
    seen_conversations = [
        conversation_id for conversation_id in theirs if this.conversations.get(conversation_id) is not None
    ]
    return Separation(
        other.prefix,
        memory_location(this),
        memory_location(other),
        entries_checked,
        len(theirs),
        seen_entries,
        seen_conversations,
        alike_entries,
    )
