"""Erasure that deletes exactly the subject's data, an audit trail that survives a kill, and read
commands that create nothing.

phpClaw's subjects are numeric WordPress ids, so these run on the phpClaw shape on MariaDB;
the kill runs on MariaDB and PostgreSQL, where a test can hold a row lock that a batch waits on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.cli import ClawGroup
from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.privacy.erasure import subject_plan
from clawmem.privacy.subjects import Subject
from clawmem.rules import subject_namespace
from clawmem.settings import PHPCLAW_SCHEMA, Settings
from clawmem.sites.site import Site
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.turn.conversations import Message
from tests.conftest import sql_url
from tests.test_cli_basics import ROOT, add_conversation

# What phpClaw's users store: ordinary text in which a short or numeric id occurs as a word.
ORDINARY = {
    ("default", "returns_policy"): "Returns are accepted within 30 days of delivery",
    ("default", "store_hours"): "Open 9 to 5",
    ("user:7", "profile"): [1, 2, 3],
    ("crm", "note"): "wp user 30 asked about order 5",
}


@pytest.fixture
def phpclaw_site(tmp_path: Path, prefix: str, clock: FakeClock) -> Iterator[Site]:
    """A site on MariaDB with tables of phpClaw's WordPress shape under this test's prefix."""
    url = sql_url("mysql", tmp_path)
    engine = create_engine(url)
    create_tables(engine, prefix, PHPCLAW_SCHEMA)
    settings_ = Settings(
        instance_path=str(tmp_path / "instance"), database_url=url, table_prefix=prefix, schema=PHPCLAW_SCHEMA
    )
    yield Site(settings_, clock)
    drop_tables(engine, prefix)
    engine.dispose()


def _cli(site: Site, *args: str) -> Any:
    return CliRunner().invoke(ClawGroup("clawmem", lambda: site), list(args))


def _stored(site: Site) -> set[tuple[str, str]]:
    memory = tables(site.prefix).memory
    with site.engine.connect() as conn:
        return {(row[0], row[1]) for row in conn.execute(sa.select(memory.c.namespace, memory.c.lookup_key))}


def _seed_ordinary(site: Site) -> None:
    for (namespace, key), value in ORDINARY.items():
        site.memory.set(key, value, namespace)


@pytest.mark.parametrize("user_id", ["30", "1", "2", "3", "5"])
def test_a_numeric_wordpress_id_takes_nobody_elses_text(phpclaw_site: Site, user_id: str) -> None:
    _seed_ordinary(phpclaw_site)
    phpclaw_site.memory.set("tea", "green", f"user:{user_id}")
    phpclaw_site.conversations.append(new_id(), [Message("user", "hello")], user_id=user_id)

    preview = _cli(phpclaw_site, "erase", "--user-id", user_id, "--mentions", "--dry-run", "-v")
    assert preview.exit_code == 0, preview.output
    assert "would delete 1 conversation, 1 message and 1 memory entry" in preview.output
    assert f"  memory user:{user_id}/tea" in preview.output
    assert (
        "default/" not in preview.output and "user:7/" not in preview.output and "crm/" not in preview.output
    )
    assert (
        "mentions of this user id in other namespaces were not searched: it is only digits" in preview.output
    )
    assert "--match TEXT" in preview.output

    done = _cli(phpclaw_site, "erase", "--user-id", user_id, "--mentions", "--yes")
    assert done.exit_code == 0, done.output
    assert _stored(phpclaw_site) == set(ORDINARY)


def test_a_mention_is_listed_with_its_text_and_deleted_only_with_mentions(phpclaw_site: Site) -> None:
    _seed_ordinary(phpclaw_site)
    phpclaw_site.memory.set("ticket-9", "customer cust-100042 wants a refund", "support")
    phpclaw_site.memory.set("tea", "green", "user:cust-100042")

    plan = subject_plan(phpclaw_site, Subject(user_id="cust-100042"))
    assert plan.entries == (("user:cust-100042", "tea"),)
    assert [(m.namespace, m.key, m.where, m.matched) for m in plan.mentions] == [
        ("support", "ticket-9", "value", "customer cust-100042 wants a refund")
    ]
    kept = _cli(phpclaw_site, "erase", "--user-id", "cust-100042", "--yes")
    assert "deleted 0 conversations, 0 messages and 1 memory entry; kept 1 mention" in kept.output
    assert ("support", "ticket-9") in _stored(phpclaw_site)
    gone = _cli(phpclaw_site, "erase", "--user-id", "cust-100042", "--mentions", "--yes")
    assert "  mention support/ticket-9 (value): customer cust-100042 wants a refund" in gone.output
    assert "deleted 0 conversations, 0 messages and 1 memory entry" in gone.output
    assert _stored(phpclaw_site) == set(ORDINARY)


SHORT_OR_NUMERIC = st.one_of(
    st.integers(0, 10**12).map(str),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=5).filter(
        str.strip
    ),
)
WORDS = st.lists(st.sampled_from(["30", "days", "5", "1", "a", "ab", "x-1", "id", "#", "9"]), max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user_id=SHORT_OR_NUMERIC, words=WORDS, mentions=st.booleans(), extra=st.booleans())
def test_an_erase_for_a_short_or_numeric_id_deletes_nothing_outside_its_namespace_without_mentions(
    phpclaw_site: Site, user_id: str, words: list[str], mentions: bool, extra: bool
) -> None:
    with phpclaw_site.engine.begin() as conn:
        conn.execute(sa.delete(tables(phpclaw_site.prefix).memory))
    namespace = subject_namespace(user_id)
    phpclaw_site.memory.set("fact", "held", namespace)
    # Text elsewhere that holds the id as a whole word, as a key and in a value.
    others = {("default", "k1"): " ".join([*words, user_id, *words]), ("crm", f"k:{user_id}"[:150]): "v"}
    if extra:
        others[("default", "k2")] = [user_id, 1, 2]
    for (other_namespace, key), value in others.items():
        try:
            phpclaw_site.memory.set(key, value, other_namespace)
        except ValueError:
            continue  # a key today's rule refuses: nothing stored to take
    outside = {pair for pair in _stored(phpclaw_site) if pair[0] != namespace}

    args = ["erase", "--user-id", user_id, "--yes", *(["--mentions"] if mentions else [])]
    result = _cli(phpclaw_site, *args)

    assert result.exit_code == 0, result.output
    left = _stored(phpclaw_site)
    assert (namespace, "fact") not in left
    # Short or numeric: never matched as a mention, so nothing outside goes even with --mentions.
    assert {pair for pair in left if pair[0] != namespace} == outside
    assert "were not searched" in result.output


# -- an audit trail that survives a kill -----------------------------------------------------------

SUBJECT = "cust-100042"


def _run_claw(tmp_path: Path, url: str, prefix: str, *args: str) -> subprocess.Popen[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("CLAW_")}
    env.update(
        PYTHONPATH=str(ROOT),
        CLAW_DATABASE_URL=url,
        CLAW_TABLE_PREFIX=prefix,
        CLAW_INSTANCE_PATH=str(tmp_path / "instance"),
    )
    return subprocess.Popen(
        [sys.executable, "-c", "from clawmem.cli import main; main()", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "instance" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(condition: Any, process: subprocess.Popen[str], what: str) -> None:
    # The run cannot get past the locked row, so this waits on a state, not on a guess of timing.
    deadline = time.monotonic() + 60
    while not condition():
        assert process.poll() is None, f"the run ended before {what}: {process.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


COMMANDS = {
    "erase": ["erase", "--user-id", SUBJECT, "--yes", "--batch-size", "1"],
    "prune": ["prune", "--older-than", "1d", "--yes", "--batch-size", "1"],
}


@pytest.mark.parametrize("sql_backend", ["mysql", "postgres"])
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.slow
def test_a_killed_run_leaves_its_committed_batches_in_the_audit_log(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, command: str
) -> None:
    now = utc_datetime(FakeClock(time.time()))
    ids = [
        add_conversation(engine, prefix, now - timedelta(days=40 - n), user_id=SUBJECT, messages=2)
        for n in range(4)
    ]
    url = engine.url.render_as_string(hide_password=False)
    conversations = tables(prefix).conversations
    with engine.connect() as holder:
        holder.begin()
        # The third batch (oldest first, one conversation each) waits on this lock.
        holder.execute(sa.select(conversations.c.id).where(conversations.c.id == ids[2]).with_for_update())
        process = _run_claw(tmp_path, url, prefix, *COMMANDS[command])
        try:
            _wait_for(
                lambda: sum(line["phase"] == "batch" for line in _lines(tmp_path)) == 2, process, "2 batches"
            )
            process.send_signal(signal.SIGKILL)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)  # reaps it and closes its pipes
        holder.rollback()

    lines = _lines(tmp_path)
    assert [line["phase"] for line in lines] == ["started", "batch", "batch"]
    assert lines[0]["plan"] == {"conversations": 4, "messages": 8} | (
        {"memory": 0, "mentions": 0, "mentions_kept": 0} if command == "erase" else {}
    )
    assert lines[2]["total"] == {"conversations": 2, "messages": 4}
    assert len({line["run"] for line in lines}) == 1
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(conversations)).scalar() == 2

    rerun = _run_claw(tmp_path, url, prefix, *COMMANDS[command])
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert "did not finish: it had committed 2 batches (2 conversations, 4 messages)" in out
    after = _lines(tmp_path)[3:]
    assert after[0]["phase"] == "started" and after[0]["previous_run_interrupted"]["run"] == lines[0]["run"]
    assert after[0]["previous_run_interrupted"]["committed"] == {"conversations": 2, "messages": 4}
    assert after[-1]["phase"] == "finished" and after[-1]["counts"]["conversations"] == 2
    assert after[-1]["outcome"] == "ok"


# -- read commands create nothing ----------------------------------------------------------------

READS = [
    ["export", "--user-id", "cust-1001"],
    ["export", "--user-id", "cust-1001", "--output", "out.json"],
    ["erase", "--user-id", "cust-1001", "--dry-run"],
    ["prune", "--older-than", "30d", "--dry-run"],
    ["sweep", "--dry-run"],
    ["flush", "--namespace", "default", "--dry-run"],
    ["stats"],
    ["audit-hash", "cust-1001"],
]


@pytest.mark.parametrize("args", READS, ids=lambda args: " ".join(args[:2]))
def test_a_read_command_from_an_empty_directory_leaves_it_empty(tmp_path: Path, args: list[str]) -> None:
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("CLAW_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", "from clawmem.cli import main; main()", *args],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert done.stdout == ""  # no JSON header, no truncated document
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert list(directory.iterdir()) == []  # no instance/, no database, no audit key, no output
    if args[0] != "audit-hash":
        assert str(directory / "instance" / "clawmem.db") in done.stderr
        assert "CLAW_DATABASE_URL" in done.stderr and "CLAW_INSTANCE_PATH" in done.stderr


def test_a_read_command_on_a_database_without_the_tables_names_the_prefix(tmp_path: Path) -> None:
    url = sql_url("sqlite", tmp_path)
    create_engine(url).dispose()
    site = Site(
        Settings(
            instance_path=str(tmp_path / "instance"),
            database_url=url,
            table_prefix=f"t{uuid.uuid4().hex[:6]}_",
        )
    )
    result = _cli(site, "export", "--user-id", "cust-1001")
    assert result.exit_code == 1 and "no clawmem tables with prefix" in result.output
    assert not (tmp_path / "instance").exists()
