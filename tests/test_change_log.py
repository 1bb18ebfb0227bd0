"""The memory table's change log (SPEC 4.1, clawmem.sql.changes): kept by triggers, so recall
sees every program's writes by reading only what changed; never missing a change that commits
late, falling back to counting when the triggers are gone, and trimmed by sweep."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from flask import Flask

from clawmem.cli import main
from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory import sql_feed
from clawmem.memory.sql import SqlMemory
from clawmem.settings import PHPCLAW_SCHEMA
from clawmem.sql import changes, kv
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from dashboard import accounts, state
from tests.conftest import backend_url, sql_url
from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

SERVERS = ["mysql", "postgres"]
ALL = ["sqlite", *SERVERS]


class Site:
    """One prefix's tables on a backend: the driver recall uses, and another program's engine
    that writes with plain SQL."""

    def __init__(self, url: str, prefix: str, clock: FakeClock, shape: str = "clawmem") -> None:
        self.engine, self.program = create_engine(url), create_engine(url)
        self.prefix, self.clock, self.shape = prefix, clock, shape
        create_tables(self.engine, prefix, shape)
        self.memory = SqlMemory(self.engine, prefix=prefix, clock=clock, shape=shape)
        self.table = tables(prefix, shape).memory

    def turn(self, word: str = "tea", namespace: str = "notes") -> list[str]:
        return [hit.key for hit in self.memory.search(word, 5, namespace)]

    def row(
        self, key: str, text: str, namespace: str = "notes", age: timedelta = timedelta(0)
    ) -> dict[str, Any]:
        stamp = utc_datetime(self.clock) - age
        value = json.dumps(text) if self.shape != PHPCLAW_SCHEMA else f's:{len(text.encode())}:"{text}";'
        return {"id": new_id(), "namespace": namespace, "lookup_key": key, "value": value,
                "expires_at": None, "created_at": stamp, "updated_at": stamp}  # fmt: skip

    def insert(self, conn: sa.Connection, key: str, text: str, **options: Any) -> None:
        conn.execute(sa.insert(self.table), [self.row(key, text, **options)])

    def update(self, conn: sa.Connection, key: str, **values: Any) -> None:
        where = (self.table.c.namespace == "notes", self.table.c.lookup_key == key)
        conn.execute(sa.update(self.table).where(*where).values(**values))

    def close(self) -> None:
        drop_tables(self.program, self.prefix)
        self.engine.dispose()
        self.program.dispose()


@pytest.fixture
def site(request: pytest.FixtureRequest, tmp_path: Path, prefix: str, clock: FakeClock) -> Iterator[Site]:
    made = Site(sql_url(request.param, tmp_path), prefix, clock)
    yield made
    made.close()


def statements(engine: sa.Engine) -> list[str]:
    """Start recording the statements ``engine`` runs (the list fills as they run)."""
    seen: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda _c, _k, text, *_: seen.append(text))
    return seen


@pytest.mark.parametrize("site", SERVERS, indirect=True)
def test_a_change_that_commits_after_a_later_one_was_read_is_never_missed(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The held transaction takes a lower number in the log than the commits read after it.
    # Even with no grace for numbers that seem missing, it stays pending while it is open.
    monkeypatch.setattr(sql_feed, "GAP_GRACE", 0.0)
    site.memory.set("first", "black coffee", "notes")
    with site.program.begin() as conn:
        site.insert(conn, "stamped", "plain water", age=timedelta(days=30))
    assert site.turn() == []
    held = site.program.connect()
    try:
        held.begin()
        site.insert(held, "late", "green tea", age=timedelta(days=30))  # stamped far back, too
        site.update(held, "stamped", value=json.dumps("mint tea"))  # its stamp left as it was
        # Several turns while it is open, each after a later commit (in another namespace: on
        # MariaDB the held UPDATE locks the gap around its row for inserts into this one).
        for number in range(4):
            with site.program.begin() as conn:
                site.insert(conn, f"later{number}", f"coffee {number}", namespace="zz")
            assert site.turn() == []
            assert site.turn("coffee", "zz") == [f"later{n}" for n in range(number + 1)]
        held.commit()
    finally:
        held.close()
    assert site.turn() == ["late", "stamped"]


@pytest.mark.parametrize("site", ALL, indirect=True)
def test_plain_sql_from_another_program_is_seen_at_the_next_turn(site: Site) -> None:
    with site.program.begin() as conn:
        for number in range(50):
            site.insert(conn, f"k{number:02d}", f"note {number}", age=timedelta(days=number))
    assert site.turn() == []
    old, table = timedelta(days=90), site.table
    steps = [
        ("insert an old-stamped row", lambda c: site.insert(c, "old", "green tea", age=old), ["old"]),
        ("rewrite, stamp kept", lambda c: site.update(c, "k40", value=json.dumps("tea")), ["k40", "old"]),
        ("delete", lambda c: c.execute(sa.delete(table).where(table.c.lookup_key == "old")), ["k40"]),
        ("move to another key", lambda c: site.update(c, "k40", lookup_key="moved"), ["moved"]),
        ("move to another namespace", lambda c: site.update(c, "moved", namespace="elsewhere"), []),
    ]
    for what, step, expected in steps:
        with site.program.begin() as conn:
            step(conn)
        assert site.turn() == expected, what
    assert site.turn(namespace="elsewhere") == ["moved"]
    assert changes.state(site.engine, site.prefix, "clawmem").on


@pytest.mark.parametrize("site", ALL, indirect=True)
def test_a_namespace_stamped_by_one_update_reads_only_what_changes_after(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another program stamps every row alike with one UPDATE, then changes one row before each
    # turn: after the turn that reads the stamped rows once, a turn reads one row's value.
    with site.program.begin() as conn:
        conn.execute(
            sa.insert(site.table),
            [site.row(f"k{n:03d}", f"note {n}", age=timedelta(days=n)) for n in range(300)],
        )
    assert site.turn() == []
    with site.program.begin() as conn:
        conn.execute(sa.update(site.table).values(updated_at=utc_datetime(site.clock)))
    assert site.turn() == []
    read: list[int] = []
    rows_of_keys = kv.rows_of_keys

    def counted(conn: Any, prefix: str, namespace: str, keys: Any, *args: Any, **options: Any) -> Any:
        read.append(len(keys))
        return rows_of_keys(conn, prefix, namespace, keys, *args, **options)

    monkeypatch.setattr(kv, "rows_of_keys", counted)
    for whole in ("index_probe", "namespace_keys", "count_namespace", "count_by_the_rest", "window_digest"):
        monkeypatch.setattr(kv, whole, lambda *args, name=whole: pytest.fail(f"{name} read the namespace"))
    for number in range(3):
        with site.program.begin() as conn:
            site.update(conn, f"k{number:03d}", value=json.dumps(f"green tea {number}"))
        read.clear()
        assert site.turn() == [f"k{n:03d}" for n in range(number + 1)]
        assert read and max(read) <= 5, read  # the key the log names, and the hits', to answer


# MariaDB only: on PostgreSQL a missed number is settled once every transaction older than it has
# ended, on the whole server, which other tests' transactions can put off.
@pytest.mark.parametrize("site", ["mysql"], indirect=True)
def test_a_rolled_back_write_stops_being_waited_for(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_feed, "GAP_GRACE", 0.0)
    site.memory.set("first", "green tea", "notes")
    assert site.turn() == ["first"]
    with site.program.connect() as conn:
        conn.begin()
        site.insert(conn, "never", "more green tea")
        conn.rollback()
    site.memory.set("second", "green tea again", "notes")  # a number after the rolled-back one
    assert site.turn() == ["first", "second"]
    assert site.turn() == ["first", "second"]  # settles the rolled-back number
    seen = statements(site.engine)
    assert site.turn() == ["first", "second"]
    asked = [text for text in seen if changes.change_table(site.prefix).name + "` WHERE" in text]
    assert len(asked) == 1 and "seq IN (" not in asked[0] and "FOR UPDATE" not in asked[0], asked


@pytest.mark.parametrize("site", ALL, indirect=True)
def test_triggers_dropped_by_hand_send_recall_back_to_counting(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    site.memory.set("first", "black coffee", "notes")
    assert site.turn() == []
    with site.program.begin() as conn:
        for name in changes.trigger_names(site.prefix):
            on = f' ON "{site.table.name}"' if conn.dialect.name == "postgresql" else ""
            conn.exec_driver_sql(f"DROP TRIGGER {conn.dialect.identifier_preparer.quote(name)}{on}")
        site.insert(conn, "unlogged", "green tea", age=timedelta(days=90))  # no log row for it
    assert site.turn() == ["unlogged"]
    with site.program.begin() as conn:
        site.insert(conn, "counted", "green tea", age=timedelta(days=90))
    assert site.turn() == ["counted", "unlogged"]  # found by the count, as without a log
    state = changes.state(site.engine, site.prefix, "clawmem")
    assert not state.on and "triggers are missing" in state.line and "init-db" in state.line
    create_tables(site.engine, site.prefix)  # init-db puts them back
    monkeypatch.setattr(sql_feed, "LOG_LOOK_AGAIN", 0.0)  # looked for again at once, not in a minute
    assert site.turn() == ["counted", "unlogged"]  # the turn that finds the log again
    assert changes.state(site.engine, site.prefix, "clawmem").on
    with site.program.begin() as conn:
        site.update(conn, "counted", value=json.dumps("coffee"))  # the count alone misses this
    assert site.turn() == ["unlogged"]


@pytest.mark.parametrize("site", ALL, indirect=True)
def test_sweep_keeps_the_log_bounded_and_a_reader_behind_it_reads_again(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(changes, "KEEP", 10)
    behind = SqlMemory(create_engine(site.engine.url), prefix=site.prefix, clock=site.clock)
    try:
        assert behind.search("tea", 5, "notes") == []
        sizes = []
        for number in range(120):  # constant writes, swept every 15
            site.memory.set(
                f"k{number % 40:02d}", "green tea" if number == 117 else f"note {number}", "notes"
            )
            if number % 15 == 14:
                site.memory.sweep()
                with site.engine.connect() as conn:
                    sizes.append(changes.size(conn, site.prefix))
        assert max(sizes) <= 11  # what is kept, and the row that says how far it trimmed
        assert [hit.key for hit in behind.search("tea", 5, "notes")] == ["k37"]  # it missed 100 rows
        assert site.turn() == ["k37"]
    finally:
        behind.engine.dispose()


def cli(url: str, prefix: str, tmp_path: Path, *args: str, shape: str | None = None) -> Any:
    env = {"CLAW_DATABASE_URL": url, "CLAW_TABLE_PREFIX": prefix, "CLAW_MEMORY_DRIVER": "sql",
           "CLAW_INSTANCE_PATH": str(tmp_path / "instance"), "CLAW_SCHEMA": shape}  # fmt: skip
    return CliRunner().invoke(main, list(args), env=env)


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])  # phpClaw's shape is not on PostgreSQL
def test_phpclaw_tables_get_the_log_only_when_asked_and_uninstall_takes_it(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    url = sql_url(backend, tmp_path)
    site = Site(url, prefix, clock, shape=PHPCLAW_SCHEMA)
    try:
        assert cli(url, prefix, tmp_path, "init-db", shape=PHPCLAW_SCHEMA).exit_code == 0
        stats = cli(url, prefix, tmp_path, "stats", shape=PHPCLAW_SCHEMA)
        assert "change log: off: recall counts the namespace every turn" in stats.output
        assert "init-db --change-log" in stats.output
        added = cli(url, prefix, tmp_path, "init-db", "--change-log", shape=PHPCLAW_SCHEMA)
        assert added.exit_code == 0, added.output
        plan, _, rest = added.output.partition(f"added change log {prefix}clawmem_changes")
        assert "adds to the database" in plan and f"AFTER UPDATE ON {prefix}phpclaw_memory" in plan
        assert f"table {prefix}clawmem_changes" in plan
        assert "change log: on" in cli(url, prefix, tmp_path, "stats", shape=PHPCLAW_SCHEMA).output
        with site.program.begin() as conn:
            site.insert(conn, "php", "green tea")  # phpClaw's own rows: PHP serialised
        assert site.turn() == ["php"]
        gone = cli(url, prefix, tmp_path, "uninstall", "--yes", shape=PHPCLAW_SCHEMA)
        assert gone.exit_code == 0, gone.output
        assert f"{prefix}clawmem_changes" in gone.output
        with site.engine.connect() as conn:
            assert not changes.has_table(conn, prefix) and not changes.armed(conn, prefix)
    finally:
        site.close()


def test_without_the_trigger_privilege_init_db_says_so_and_recall_counts(
    tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    root = create_engine(backend_url("mysql"))
    user = f"claw_{prefix.rstrip('_')}"
    with root.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'pw'")
        conn.exec_driver_sql(
            f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER ON test.* TO '{user}'@'%%'"
        )
    url = str(sa.make_url(backend_url("mysql")).set(username=user, password="pw").render_as_string(False))
    try:
        done = cli(url, prefix, tmp_path, "init-db")
        assert done.exit_code == 0, done.output
        assert (
            "change log not installed" in done.output
            and "recall counts the namespace each turn" in done.output
        )
        site = Site(url, prefix, clock)  # no triggers: counted, still exact
        site.memory.set("first", "green tea", "notes")
        assert site.turn() == ["first"]
        with site.program.begin() as conn:
            site.insert(conn, "other", "green tea", age=timedelta(days=90))
        assert site.turn() == ["first", "other"]
        assert "change log: off" in cli(url, prefix, tmp_path, "stats").output
        site.close()
    finally:
        with root.begin() as conn:
            conn.exec_driver_sql(f"DROP USER '{user}'@'%%'")
        root.dispose()


def test_the_settings_page_says_which_way_recall_follows_the_table(
    make_app: Callable[..., Flask], clock: FakeClock, prefix: str
) -> None:
    app = make_app()
    with app.app_context():
        state.memory().set("fact", "green tea")  # the tables, made by the app's first write
        accounts.create_admin(ADMIN, PASSWORD, clock())
    client = app.test_client()
    assert sign_in(client).status_code == 302

    def said() -> str:
        page = client.get("/settings").get_data(as_text=True)
        return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())

    assert (
        f"The change log is on : recall reads only what changed, from the change log {prefix}clawmem_changes"
        in said()
    )
    with app.app_context(), state.site().engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TRIGGER {prefix}clawmem_changes_update" + (
            f" ON {prefix}phpclaw_memory" if conn.dialect.name == "postgresql" else ""))  # fmt: skip
    assert (
        "The change log is off : recall counts the namespace every turn (its triggers are missing)" in said()
    )


@pytest.mark.parametrize("site", ["postgres"], indirect=True)
def test_a_log_without_statistics_is_read_through_its_primary_key(site: Site) -> None:
    # A bulk import fills the log, and with autovacuum off nothing ever analyzes it: an open
    # range (seq > :after) was then planned as a third of the log, read whole at every turn
    # after any commit (5 ms at 100,000 rows, PostgreSQL's CPU per recall of every worker).
    log = changes.change_table(site.prefix).name
    with site.program.begin() as conn:
        conn.execute(sa.text(f'ALTER TABLE "{log}" SET (autovacuum_enabled = false)'))
        conn.execute(sa.insert(site.table), [site.row(f"k{n:05d}", f"note {n}") for n in range(20_000)])
    assert site.turn("note")[:1] == ["k00000"]
    with site.program.connect() as conn:
        assert conn.execute(sa.text(f"SELECT reltuples FROM pg_class WHERE relname = '{log}'")).scalar() < 0
        high = conn.execute(sa.text(f'SELECT max(seq) FROM "{log}"')).scalar()
        for read in (changes._read_select("postgresql", site.prefix, False, False, below)
                     for below in (False, True)):  # fmt: skip
            plan = conn.execute(sa.text(f"EXPLAIN {read.text}"), {"after": high, "below": 1}).scalars()
            assert f"Seq Scan on {log}" not in "\n".join(plan)
    with site.program.begin() as conn:
        site.insert(conn, "late", "green tea")
    assert site.turn() == ["late"]


@pytest.mark.slow
@pytest.mark.parametrize("site", ["postgres"], indirect=True)
def test_a_stamp_of_more_rows_than_a_statement_takes_parameters_is_read_in_parts(site: Site) -> None:
    # PostgreSQL takes at most 65,535 parameters in a statement: the keys a turn reads again
    # after one UPDATE rewrote them all are read in parts, never refused.
    rows = [site.row(f"k{number:05d}", f"note {number}") for number in range(66_000)]
    rows[65_999]["value"] = json.dumps("green tea")
    with site.program.begin() as conn:
        for start in range(0, len(rows), 5000):
            conn.execute(sa.insert(site.table), rows[start : start + 5000])
    assert site.turn() == ["k65999"]
    with site.program.begin() as conn:
        conn.execute(sa.update(site.table).values(value=json.dumps("black coffee")))
    assert site.turn() == []
    assert site.turn("coffee")[:2] == ["k00000", "k00001"]
