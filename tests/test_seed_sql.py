"""The operator SQL from the article runs as written against a MariaDB install with prefix ``wp_``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from clawmem.clock import FakeClock
from clawmem.crypto import PLAIN, Cipher, Keyring, generate_key
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, tables
from clawmem.turn.conversations import ConversationLog
from tests.conftest import backend_url

DATABASE = "clawmem_seed"

INSPECTION = """
SELECT table_name,
       table_rows,
       ROUND((data_length + index_length) / 1024 / 1024, 2) AS mb
FROM information_schema.tables
WHERE table_schema = 'clawmem_seed'
  AND table_name LIKE '%phpclaw%';
"""

RETENTION = [
    """
DELETE m FROM wp_phpclaw_messages m
  JOIN wp_phpclaw_conversations c ON c.id = m.conversation_id
 WHERE c.created_at < DATE_SUB(NOW(), INTERVAL 90 DAY);
""",
    """
DELETE FROM wp_phpclaw_conversations
 WHERE created_at < DATE_SUB(NOW(), INTERVAL 90 DAY);
""",
]


def run_as_written(engine: Any, statement: str) -> tuple[list[tuple[Any, ...]], int]:
    """Run ``statement`` through the bare DB-API cursor, exactly as an operator would paste it."""
    connection = engine.raw_connection()
    try:
        cursor = connection.cursor()
        cursor.execute(statement)
        rows = list(cursor.fetchall()) if cursor.description else []
        connection.commit()
        return rows, cursor.rowcount
    finally:
        connection.close()


@pytest.fixture
def wp_engine() -> Iterator[Any]:
    server = create_engine(backend_url("mysql"))
    with server.begin() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE}")
        conn.exec_driver_sql(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
    engine = create_engine(make_url(backend_url("mysql")).set(database=DATABASE).render_as_string(False))
    with engine.connect() as conn:  # the article's NOW() is the session's; DATETIME columns hold UTC
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    create_tables(engine, "wp_")
    yield engine
    engine.dispose()
    with server.begin() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE}")
    server.dispose()


# The article's SQL reads only plain columns (ids, times, table names), so it runs the same on a
# database whose customer text is encrypted (SPEC 13).
ENCRYPTED = Cipher(Keyring.from_text(generate_key("k1")))
CIPHERS = pytest.mark.parametrize("cipher", [PLAIN, ENCRYPTED], ids=["plain", "encrypted"])


@CIPHERS
def test_inspection_query_returns_exactly_the_three_tables(wp_engine: Any, cipher: Cipher) -> None:
    memory = SqlMemory(wp_engine, prefix="wp_")
    memory.use_cipher(cipher, "wp_")
    memory.set("k", "v")
    rows, _ = run_as_written(wp_engine, INSPECTION)
    assert sorted(row[0] for row in rows) == [
        "wp_phpclaw_conversations",
        "wp_phpclaw_memory",
        "wp_phpclaw_messages",
    ]


@CIPHERS
def test_retention_deletes_remove_exactly_the_old_rows(wp_engine: Any, cipher: Cipher) -> None:
    with wp_engine.connect() as conn:
        now = conn.exec_driver_sql("SELECT NOW()").scalar()
    # The log stamps rows with its clock, read as UTC; set it to the server's NOW() minus the age.
    clock = FakeClock(now.replace(tzinfo=UTC).timestamp())
    conversations = ConversationLog(wp_engine, prefix="wp_", clock=clock, cipher=cipher)
    ages = {"old1": 200, "old2": 91, "young1": 89, "young2": 1}
    for key, days in ages.items():
        clock.now = now.replace(tzinfo=UTC).timestamp() - days * 86_400
        history = [{"role": "user", "content": f"{key} question"}, {"role": "assistant", "content": "answer"}]
        conversations.append(key, history)
    schema = tables("wp_")
    with wp_engine.connect() as conn:
        conn.execute(
            sa.update(schema.messages).values(created_at=datetime(2000, 1, 1))
        )  # only c.created_at counts
        conn.commit()

    deleted = [run_as_written(wp_engine, statement)[1] for statement in RETENTION]
    assert deleted == [4, 2]
    assert sorted(c.id for c in conversations.list().items) == ["young1", "young2"]
    assert [m.content for m in conversations.load("young1").messages] == ["young1 question", "answer"]
    with wp_engine.connect() as conn:
        stored = conn.execute(sa.select(schema.messages.c.content)).scalars().all()
    assert all(text.startswith("cm1$k1$") for text in stored) == (cipher is ENCRYPTED)
    with wp_engine.connect() as conn:
        remaining = conn.execute(sa.select(schema.messages.c.conversation_id).distinct()).scalars().all()
    assert sorted(remaining) == ["young1", "young2"]
