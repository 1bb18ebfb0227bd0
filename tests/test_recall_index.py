"""The word index, its reports and the preview built on it: regressions found along the way
(the state machines that prove freshness are in tests/conformance/)."""

from __future__ import annotations

import html
import itertools
import json
import math
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.array import ArrayMemory
from clawmem.memory.sql import SqlMemory
from clawmem.recall import MessageAugmenter, injection_counts, plan
from clawmem.recall.feeds import fresh_index
from clawmem.recall.rankings import scan_ranking
from clawmem.records import MemoryHit
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from tests.conformance.test_freshness import (
    test_process_b_recalls_what_a_scan_of_the_backend_gives as process_b_recalls_as_a_scan,
)
from tests.conformance.worlds import KEYS, VOCABULARY, Turn, expected_turn, report_of
from tests.conftest import backend_url, sql_url
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent

# -- regressions -----------------------------------------------------------------------------------


def test_a_report_read_after_the_index_changed_still_describes_its_turn(clock: FakeClock) -> None:
    # Decisions past top_k are computed when read. Meanwhile other turns may bring the index up
    # to date: entries replaced and removed, ranks renumbered, slots compacted.
    memory = ArrayMemory(clock=clock)
    for number in range(3000):
        memory.set(f"k{number:05d}", f"tea {'green' if number % 3 else 'black'} note", "notes")
    result = MessageAugmenter(memory, top_k=2, namespace="notes", announce=False).augment("green tea")
    expected = MessageAugmenter(memory, top_k=2, namespace="notes", ranker=scan_ranking).augment("green tea")
    for number in range(0, 3000, 2):
        memory.forget(f"k{number:05d}", "notes")
    for number in range(1, 3000, 4):
        memory.set(f"k{number:05d}", "coffee", "notes")
    memory.set("a-first-key", "green tea", "notes")
    assert list(result.decisions) == list(expected.decisions)
    assert len(result.decisions) == 3000 and result.zero_overlap == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["array", "sql-sqlite"])
def test_common_words_scored_from_their_marks_recall_as_a_scan(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At scale a word held by many entries is scored by adding one byte per slot; here every
    # word held by a quarter of a namespace's slots is.
    from clawmem.recall import index as index_module

    monkeypatch.setattr(index_module, "_DENSE_FROM", 1)
    monkeypatch.setattr(index_module, "_DENSE_SHARE", 4)
    process_b_recalls_as_a_scan(backend, tmp_path)


def test_common_words_scored_from_their_marks_stay_exact_through_writes_and_compaction(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clawmem.recall import index as index_module

    monkeypatch.setattr(index_module, "_DENSE_FROM", 256)
    memory = ArrayMemory(clock=clock)
    for number in range(3000):
        memory.set(f"k{number:05d}", f"tea {'green' if number % 3 else 'black'} w{number % 50}", "notes")

    def recall_as_a_scan(message: str) -> None:
        indexed = MessageAugmenter(memory, namespace="notes", announce=False).augment(message)
        scanned = MessageAugmenter(memory, namespace="notes", announce=False, ranker=scan_ranking).augment(
            message
        )
        assert report_of(indexed) == report_of(scanned)
        assert list(indexed.decisions) == list(scanned.decisions)

    recall_as_a_scan("green tea w7")
    assert {"tea", "green"} <= set(fresh_index(memory, "notes").dense)
    for number in range(0, 3000, 2):  # half the slots die: the index compacts
        memory.forget(f"k{number:05d}", "notes")
    recall_as_a_scan("green tea w7")
    for number in range(1, 3000, 4):  # replaced entries: new slots merged into the marks
        memory.set(f"k{number:05d}", "coffee w7", "notes")
    memory.set("a-first-key", "black tea", "notes")
    recall_as_a_scan("green tea w7")
    recall_as_a_scan("black tea coffee")


def test_postings_stay_in_ascending_slot_order() -> None:
    # Candidates.matched binary-searches them: loading, appending and compacting keep the order.
    import numpy as np

    from clawmem.recall.index import WordIndex

    index = WordIndex("notes")
    index.load((f"k{number:04d}", f"tea w{number % 7} w{number % 11}", None) for number in range(3000))
    for number in range(3000):
        if number % 3:
            index.remove(f"k{number:04d}")
    assert index.size < 3000  # compacted
    for number in range(0, 3000, 2):
        index.put(f"k{number:04d}", f"coffee w{number % 5}", None)
    for number in range(2000):
        index.put(f"new{number:04d}", f"tea w{number % 3}", None)
    for word in index.words():
        postings = index.postings_of(word)
        assert postings is not None and bool(np.all(np.diff(postings) > 0)), word


def test_sqlite_drivers_on_one_engine_leave_its_pool_alone(tmp_path: Path, clock: FakeClock) -> None:
    # Each SQLite driver watches PRAGMA data_version on a connection it keeps; that connection
    # must not be one of the pool's, or a few drivers on a shared engine exhaust it.
    engine = create_engine(f"sqlite:///{tmp_path / 'shared.db'}", pool_size=1, max_overflow=0, pool_timeout=1)
    create_tables(engine, "")
    drivers = [SqlMemory(engine, clock=clock) for _ in range(3)]
    try:
        for number, driver in enumerate(drivers):
            driver.set(f"tea-{number}", "green tea", "notes")
            assert [hit.key for hit in driver.search("tea", 5, "notes")] == [
                f"tea-{n}" for n in range(number + 1)
            ]
    finally:
        engine.dispose()


def test_a_redis_index_built_on_an_empty_log_notices_the_log_was_cut(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    import redis

    from clawmem.memory import redis as redis_driver

    monkeypatch.setattr(redis_driver, "LOG_LENGTH", 20)
    client = redis.Redis.from_url(backend_url("redis"))
    prefix = f"clawtest:{uuid.uuid4().hex[:8]}:"
    a = redis_driver.RedisMemory(client=client, prefix=prefix, clock=clock)
    b = redis_driver.RedisMemory(client=client, prefix=prefix, clock=clock)
    try:
        assert b.search("tea", 5, "notes") == []  # B's index starts from an empty log
        for number in range(400):  # far more changes than the log keeps
            a.set(f"k{number:03d}", "green tea" if number == 0 else f"coffee {number}", "notes")
        assert client.xlen(a.log_key("notes")) < 400
        assert b.search("tea", 5, "notes") == [MemoryHit("k000", "green tea", "notes", 1)]
    finally:
        for name in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(name)
        client.close()


@pytest.mark.parametrize("backend", ["mysql", "postgres"])
def test_a_bulk_stamped_namespace_reads_again_only_the_rows_that_changed(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # A bulk import stamps every row alike, so all of them stay within the overlap window. A row
    # another program rewrites without changing its stamp is still seen, only the values of the
    # rows that changed are read again (plus the hits' own, to answer), and when nothing changed
    # the window is not read at all.
    url = sql_url(backend, tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    table = tables(prefix).memory
    stamp = utc_datetime(clock)
    rows = [
        {"id": new_id(), "namespace": "bulk", "lookup_key": f"k{number:03d}", "expires_at": None,
         "value": json.dumps(f"note {number}"), "created_at": stamp, "updated_at": stamp}
        for number in range(300)
    ]  # fmt: skip
    rows[7]["value"] = json.dumps("green tea")
    values_read: list[int] = []

    def count_values(conn: Any, cursor: Any, *args: Any) -> None:
        if any(column[0] == "value" for column in cursor.description or ()):
            values_read.append(cursor.rowcount)

    try:
        with program.begin() as conn:
            conn.execute(sa.insert(table), rows)
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k007"]
        with program.begin() as conn:
            for key, value in (("k007", "coffee"), ("k123", "green tea, again")):
                where = (table.c.namespace == "bulk", table.c.lookup_key == key)
                conn.execute(sa.update(table).where(*where).values(value=json.dumps(value)))
        sa.event.listen(engine, "after_cursor_execute", count_values)
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k123"]
        assert 0 < sum(values_read) <= 3
        # Nothing changed since: not even the marks of the window's 300 rows are read again.
        rows_read: list[int] = []
        sa.event.listen(engine, "after_cursor_execute", lambda *args: rows_read.append(args[1].rowcount))
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k123"]
        assert rows_read and max(rows_read) < 300
    finally:
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "postgres"])
def test_a_survey_of_many_messages_catches_the_index_up_once(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # Cold memory ranks hundreds of recent messages: what another program wrote just before is
    # counted, and the backend is asked a few things for 200 messages, as for 5, not one per message.
    url = sql_url(backend, tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    for number, words in enumerate(["green tea", "black tea", "coffee beans", "tea and coffee"]):
        memory.set(f"k{number}", words, "survey")
    messages = [f"{drink} please" for drink in itertools.islice(itertools.cycle(["tea", "coffee"]), 200)]
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    try:
        issued = []
        for count, newest in ((5, "tea please, hot"), (200, "coffee please")):
            with program.begin() as conn:  # another program's write, just before the survey
                conn.execute(sa.insert(tables(prefix).memory), {
                    "id": new_id(), "namespace": "survey", "lookup_key": f"new{count}", "expires_at": None,
                    "value": json.dumps(newest), "created_at": utc_datetime(clock),
                    "updated_at": utc_datetime(clock)})  # fmt: skip
            statements.clear()
            counts = injection_counts(memory, messages[:count], "survey", 3, int(clock()))
            issued.append(len(statements))
            expected: dict[str, int] = {}
            for message in messages[:count]:
                for key, _ in plan(scan_ranking(memory, message, ["survey"], int(clock())), 3, 4096)[0]:
                    expected[key] = expected.get(key, 0) + 1
            assert dict(counts) == expected
            assert counts[f"new{count}"] > 0, "another program's write is counted"
        assert max(issued) <= 10, f"statements for 5 and 200 messages: {issued}"  # not one per message
    finally:
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


# -- the dashboard's preview -----------------------------------------------------------------------

DECISION_ROW = re.compile(
    r'<tr class="decision (\w+)">\s*<td><a href="[^"]+"><code>([^<]*)</code></a></td>\s*'
    r'<td class="num">(\d+)</td>\s*<td class="matched">([^<]*)</td>'
)
ZERO_OVERLAP = re.compile(r'<span class="zero-overlap">(\d+)</span>')
AUGMENTED = re.compile(r'<pre class="augmented">(.*?)</pre>', re.S)
MORE = re.compile(r'id="decisions-more".*?href="([^"]+)"', re.S)


@dataclass(frozen=True)
class Preview:
    """What one preview page shows: the text, its decision rows (key, score, matched words)
    and the zero-overlap count."""

    text: str
    rows: list[tuple[str, int, str]]
    zero_overlap: int
    more: str | None


def read_preview(body: str) -> Preview:
    text = AUGMENTED.search(body)
    zero = ZERO_OVERLAP.search(body)
    more = MORE.search(body)
    assert text and zero, body[:2000]
    rows = [
        (html.unescape(key), int(score), html.unescape(words))
        for _, key, score, words in DECISION_ROW.findall(body)
    ]
    return Preview(
        html.unescape(text.group(1)), rows, int(zero.group(1)), html.unescape(more.group(1)) if more else None
    )


def expected_rows(turn: Turn) -> list[tuple[str, int, str]]:
    return [(d.key, d.score, ", ".join(d.matched)) for d in turn.decisions]


def test_the_preview_shows_the_tokenisers_matched_words_and_zero_overlap_count(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, prefix: str
) -> None:
    import random

    from dashboard import state

    rng = random.Random(10)
    with app.app_context():
        driver = state.driver()
        engine = state.engine()
        for number in range(160):
            chosen = rng.sample(VOCABULARY, rng.randint(0, 4))
            value: Any = " ".join(chosen) if number % 3 else {rng.choice(VOCABULARY): chosen, "n": number}
            key = f"{rng.choice(KEYS)}-{number}"
            driver.set(key, value, "default", rng.choice([None, None, 60, 600]))
        # Rows another program wrote, in its own JSON.
        table = tables(prefix).memory
        stamp = utc_datetime(clock)
        with engine.begin() as conn:
            for number in range(20):
                value = {"Tea": ["CAFÉ", "straße"], "n": number} if number % 2 else "Don’t STRASSE well-known"
                conn.execute(
                    sa.insert(table).values(
                        id=new_id(),
                        namespace="default",
                        lookup_key=f"program-{number}",
                        value=json.dumps(value),
                        expires_at=None,
                        created_at=stamp,
                        updated_at=stamp,
                    )
                )
    signed_in.get("/preview", query_string={"message": "warm the index up"})
    clock.advance(61)  # some entries expired since the index was built
    message = "Tea? Don't forget the CAFÉ, strasse and well-known 123 refunds: user_123 ox"
    with app.app_context():
        rows = {row.key: (row.value, row.expires_at) for row in state.driver().records()}
    expected = expected_turn([("default", rows)], message, 3, 4096, math.floor(clock()))
    assert len(expected.decisions) > 50 and expected.zero_overlap > 0  # two pages, and some share none
    shown = read_preview(page_text(signed_in.get("/preview", query_string={"message": message})))
    assert shown.text == expected.text
    assert shown.zero_overlap == expected.zero_overlap
    pages = shown.rows
    more = shown.more
    while more:
        page = read_preview(page_text(signed_in.get(more)))
        pages += page.rows
        more = page.more
    assert pages == expected_rows(expected)


# -- two gunicorn workers on MariaDB ---------------------------------------------------------------

PASSWORD = "correct horse battery staple"
FILLERS = 30
