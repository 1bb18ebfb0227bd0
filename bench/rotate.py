"""Key rotation on SQLite: ``keys rotate`` re-encrypting every row from an old master key to a new
one, and sealing rows written before encryption was on. The target is at least 20,000 rows a
second.

A temporary SQLite database gets conversations with messages and memory entries, bulk-loaded with
executemany: once sealed under the key ``old`` (as an encrypted site writes them), once as
plaintext. Each is then rotated to the key ``new`` with the rotation the CLI runs (batches of
``--batch-size`` rows, each one transaction, written back only where unchanged). Prints rows,
seconds and rows per second for each, and the load (``uptime``) of the machine, which is shared;
also the process's CPU time, whose rate is what one core of its own would do.
Never part of the test suite.

    .venv/bin/python -m bench.rotate [--conversations 5000] [--messages 10] [--entries 20000]
                                     [--batch-size 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from clawmem.crypto import PLAIN, Cipher, Context, Keyring, generate_key
from clawmem.ids import new_id
from clawmem.settings import Settings
from clawmem.sites import rotation
from clawmem.sites.site import Site
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, tables

OLD, NEW = generate_key("old"), generate_key("new")
CHUNK = 10_000
START = datetime(2026, 1, 1)
CONTENT = "Customer asked about the delivery window and the refund policy for order #{n}."


def load(
    engine: sa.engine.Engine, prefix: str, cipher: Cipher, conversations: int, messages: int, entries: int
) -> int:
    """Bulk-load the rows as a site with ``cipher`` writes them; return how many rows."""
    schema = tables(prefix)

    def seal(text: str, table: str, row_id: str, column: str) -> str:
        return cipher.seal(text, Context.row(prefix, table, row_id, column))

    conversation_rows, message_rows = [], []
    for n in range(conversations):
        cid = new_id()
        moment = START + timedelta(seconds=n)
        conversation_rows.append(
            {
                "id": cid,
                "namespace": "default",
                "user_id": "",
                "title": seal(f"Order {n}", "conversations", cid, "title"),
                "metadata": seal(json.dumps({"channel": "web"}), "conversations", cid, "metadata"),
                "created_at": moment,
                "updated_at": moment,
            }
        )
        for k in range(messages):
            mid = new_id()
            message_rows.append(
                {
                    "id": mid,
                    "conversation_id": cid,
                    "role": "user" if k % 2 == 0 else "assistant",
                    "content": seal(CONTENT.format(n=n), "messages", mid, "content"),
                    "created_at": moment,
                }
            )
    memory_rows = []
    for n in range(entries):
        key = f"fact-{n}"
        memory_rows.append(
            {
                "id": new_id(),
                "namespace": "default",
                "lookup_key": key,
                "value": cipher.seal(
                    json.dumps(CONTENT.format(n=n)), Context.entry(prefix, "default", key, "value")
                ),
                "created_at": START,
                "updated_at": START,
            }
        )
    with engine.begin() as conn:
        for table, rows in (
            (schema.conversations, conversation_rows),
            (schema.messages, message_rows),
            (schema.memory, memory_rows),
        ):
            for start in range(0, len(rows), CHUNK):
                conn.execute(sa.insert(table), rows[start : start + CHUNK])
    return len(conversation_rows) + len(message_rows) + len(memory_rows)


def measure(directory: Path, label: str, cipher: Cipher, arguments: argparse.Namespace) -> dict[str, Any]:
    """Load a fresh database sealed with ``cipher`` and rotate it to the new key."""
    prefix = f"b{uuid.uuid4().hex[:6]}_"
    url = f"sqlite:///{directory / f'{label}.db'}"
    engine = create_engine(url)
    create_tables(engine, prefix)
    rows = load(engine, prefix, cipher, arguments.conversations, arguments.messages, arguments.entries)
    settings = Settings(
        instance_path=str(directory / "instance"),
        database_url=url,
        table_prefix=prefix,
        encryption_keys=f"{NEW},{OLD}",
    )
    site = Site(settings)
    start, cpu_start = time.perf_counter(), time.process_time()
    done = rotation.rotate(site, arguments.batch_size)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    assert done.total == rows and not done.undecryptable, (done.total, rows)
    assert rotation.rotation_plan(site, rotation.rotation_cipher(settings)) == dict.fromkeys(
        rotation.TABLES, 0
    )
    engine.dispose()
    return {
        "from": label,
        "rows": rows,
        "seconds": round(seconds, 2),
        "rows_per_second": round(rows / seconds),
        "cpu_seconds": round(cpu, 2),
        "rows_per_cpu_second": round(rows / cpu),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=5000)
    parser.add_argument("--messages", type=int, default=10, help="messages per conversation")
    parser.add_argument("--entries", type=int, default=20000, help="memory entries")
    parser.add_argument("--batch-size", type=int, default=1000)
    arguments = parser.parse_args()
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        results = [
            measure(directory, "old key", Cipher(Keyring.from_text(OLD)), arguments),
            measure(directory, "plaintext", PLAIN, arguments),
        ]
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    for result in results:
        verdict = "meets" if result["rows_per_second"] >= 20_000 else "MISSES"
        print(
            f"rotate from {result['from']:<9}: {result['rows']:>7,} rows in {result['seconds']:>6.2f} s = "
            f"{result['rows_per_second']:>7,} rows/s ({verdict} the 20,000 rows/s target); "
            f"{result['cpu_seconds']:.2f} s of CPU = {result['rows_per_cpu_second']:,} rows per CPU second"
        )
    print(f"load before: {load_before}")
    print(f"load after:  {load_after}")
    print(f"cpus: {os.cpu_count()}, batch size {arguments.batch_size}")


if __name__ == "__main__":
    main()
