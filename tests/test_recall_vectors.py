"""Vectors persisted: the vectors table, kept exact by the change feed, and ``clawmem embed``.

Embedders are the cheap, counting ones of :mod:`tests.embedders` (the bundled encoder where it
is cheap), so "embedded again" is counted, not guessed.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from clawmem.cli import main
from clawmem.clock import FakeClock
from clawmem.errors import EmbeddingMismatch
from clawmem.memory.sql import SqlMemory
from clawmem.privacy import erasure
from clawmem.privacy.subjects import Subject
from clawmem.recall import MessageAugmenter
from clawmem.recall.embeddings import _Space, held_rows, quantise
from clawmem.recall.fusion import SemanticScorer
from clawmem.recall.words import text_of
from clawmem.rules import subject_namespace
from clawmem.settings import Settings
from clawmem.sites import operations
from clawmem.sites.site import Site
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.sql.vectors import create_vector_table, drop_vector_table, vector_table
from tests import embedders
from tests.conftest import sql_url
from tests.embedders import Counting, HashedWords

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def url(sql_backend: str, tmp_path: Path) -> str:
    return sql_url(sql_backend, tmp_path)


@pytest.fixture
def vector_engine(url: str, prefix: str) -> Any:
    """An engine with the three tables and the vectors table of ``prefix`` (dropped after)."""
    engine = create_engine(url)
    create_tables(engine, prefix)
    create_vector_table(engine, prefix)
    yield engine
    drop_vector_table(engine, prefix)
    drop_tables(engine, prefix)
    engine.dispose()


def stored_vectors(engine: Any, prefix: str) -> dict[tuple[str, str], str]:
    """Return every vector row as ``(namespace, key) -> text print``, read with plain SQL."""
    table = vector_table(prefix)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.namespace, table.c.lookup_key, table.c.text_print))
        return {(namespace, key): printed for namespace, key, printed in rows}


def hybrid_turn(scorer: SemanticScorer, memory: Any, message: str, namespace: str = "n") -> Any:
    return MessageAugmenter(memory, namespace=namespace, top_k=3, ranker=scorer.hybrid).augment(message)


ENTRIES = {
    "toronto": "she moved to Toronto in May",
    "car": "bought a new automobile last week",
    "pie": "the apple pie recipe uses butter",
    "dog": "the dog sleeps by the door",
    "tea": "green tea every morning",
}


def filled(engine: Any, prefix: str, clock: FakeClock, entries: dict[str, str] = ENTRIES) -> SqlMemory:
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    for key, value in entries.items():
        memory.set(key, value, namespace="n")
    return memory


# -- neither a restart nor a second worker embeds again ---------------------------------------


def test_a_restart_embeds_nothing_again(vector_engine, prefix, clock):
    memory = filled(vector_engine, prefix, clock)
    first = Counting(HashedWords())
    result = hybrid_turn(SemanticScorer(first, embed_on_read=True), memory, "where did she move")
    assert sorted(first.texts) == sorted([*ENTRIES.values(), "where did she move"])
    assert result.semantic_coverage == "semantic: 5 of 5 entries embedded"
    assert set(stored_vectors(vector_engine, prefix)) == {("n", key) for key in ENTRIES}
    # A new process: a new driver and scorer on the same database embed only the message.
    again = Counting(HashedWords())
    restarted = SqlMemory(vector_engine, prefix=prefix, clock=clock)
    result = hybrid_turn(SemanticScorer(again, embed_on_read=True), restarted, "where did she move")
    assert again.texts == ["where did she move"]
    assert result.semantic_coverage == "semantic: 5 of 5 entries embedded"


def test_a_worker_reads_the_vectors_another_wrote_after_it_started(vector_engine, prefix, clock):
    memory = filled(vector_engine, prefix, clock, {"toronto": ENTRIES["toronto"]})
    one, two = Counting(HashedWords()), Counting(HashedWords())
    worker_one, worker_two = SemanticScorer(one, embed_on_read=True), SemanticScorer(two, embed_on_read=True)
    hybrid_turn(worker_one, memory, "hello")
    hybrid_turn(worker_two, SqlMemory(vector_engine, prefix=prefix, clock=clock), "hello")
    memory.set("car", ENTRIES["car"], namespace="n")
    hybrid_turn(worker_one, memory, "hello")  # embeds the new entry
    result = hybrid_turn(worker_two, SqlMemory(vector_engine, prefix=prefix, clock=clock), "hello")
    assert ENTRIES["car"] in one.texts and ENTRIES["car"] not in two.texts
    assert result.semantic_coverage == "semantic: 2 of 2 entries embedded"


def test_a_second_process_embeds_nothing_again(vector_engine, prefix, clock, url, tmp_path):
    memory = filled(vector_engine, prefix, clock)
    hybrid_turn(SemanticScorer(HashedWords(), embed_on_read=True), memory, "hello")
    done = run_embed(url, prefix, tmp_path, "tests.embedders:counting")
    assert done.returncode == 0, done.stderr
    assert "embedded 0 entries; 5 of 5 entries embedded" in done.stdout


# -- the change feed keeps the table exact -------------------------------------------------------


def test_forget_flush_and_sweep_delete_the_vectors(vector_engine, prefix, clock):
    memory = filled(vector_engine, prefix, clock)
    memory.set("brief", "a short lived note", namespace="n", ttl=60)
    memory.set("other", "in another namespace", namespace="m")
    scorer = SemanticScorer(HashedWords(), embed_on_read=True)
    hybrid_turn(scorer, memory, "hello")
    hybrid_turn(scorer, memory, "hello", namespace="m")
    assert len(stored_vectors(vector_engine, prefix)) == 7
    memory.forget("toronto", namespace="n")  # no turn in between: the driver deletes it
    assert ("n", "toronto") not in stored_vectors(vector_engine, prefix)
    memory.flush(namespace="m")
    assert ("m", "other") not in stored_vectors(vector_engine, prefix)
    clock.advance(61)
    assert memory.sweep() == {"n": 1}
    assert set(stored_vectors(vector_engine, prefix)) == {("n", key) for key in ENTRIES if key != "toronto"}
    assert "semantic: 4 of 4" in hybrid_turn(scorer, memory, "hello").semantic_coverage


def test_an_expired_entry_loses_its_vector_on_the_next_turn(vector_engine, prefix, clock):
    memory = filled(vector_engine, prefix, clock, {"tea": ENTRIES["tea"]})
    memory.set("brief", "a short lived note", namespace="n", ttl=60)
    scorer = SemanticScorer(HashedWords(), embed_on_read=True)
    hybrid_turn(scorer, memory, "hello")
    assert ("n", "brief") in stored_vectors(vector_engine, prefix)
    clock.advance(61)
    hybrid_turn(scorer, memory, "hello")
    assert set(stored_vectors(vector_engine, prefix)) == {("n", "tea")}


def test_erasing_a_subject_deletes_the_vectors_of_its_entries(vector_engine, prefix, clock, url, tmp_path):
    settings = Settings.from_mapping(
        {"DATABASE_URL": url, "TABLE_PREFIX": prefix, "MEMORY_DRIVER": "sql"}, instance_path=tmp_path
    )
    site = Site(settings, clock)
    own = subject_namespace("cust-42")
    site.driver.set("diet", "cust-42 eats no meat", namespace=own)
    site.driver.set("tea", ENTRIES["tea"], namespace="n")
    scorer = SemanticScorer(HashedWords(), embed_on_read=True)
    hybrid_turn(scorer, site.memory, "hello", namespace=own)
    hybrid_turn(scorer, site.memory, "hello")
    assert (own, "diet") in stored_vectors(vector_engine, prefix)
    erasure.erase_subject(site, Subject(user_id="cust-42"))
    assert set(stored_vectors(vector_engine, prefix)) == {("n", "tea")}


PLAIN_SQL = textwrap.dedent(
    """
    import sys
    import sqlalchemy as sa
    url, table = sys.argv[1], sys.argv[2]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {table} WHERE lookup_key = 'dog'"))
        conn.execute(sa.text(f"UPDATE {table} SET value = '\\"black coffee now\\"' WHERE lookup_key = 'tea'"))
    """
)


def test_plain_sql_from_another_process_is_followed(vector_engine, prefix, clock, url):
    memory = filled(vector_engine, prefix, clock)
    embedder = Counting(HashedWords())
    scorer = SemanticScorer(embedder, embed_on_read=True)
    hybrid_turn(scorer, memory, "hello")
    before = stored_vectors(vector_engine, prefix)
    table = f"{prefix}phpclaw_memory"
    done = subprocess.run([sys.executable, "-c", PLAIN_SQL, url, table], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    embedder.texts.clear()
    result = hybrid_turn(scorer, memory, "coffee")
    after = stored_vectors(vector_engine, prefix)
    assert ("n", "dog") not in after
    assert after[("n", "tea")] != before[("n", "tea")]  # the vector of the new text
    assert embedder.texts == ["coffee", "black coffee now"]
    assert result.semantic_coverage == "semantic: 4 of 4 entries embedded"


def test_a_changed_entry_never_keeps_its_old_vector(vector_engine, prefix, clock):
    memory = filled(vector_engine, prefix, clock)
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)
    store = scorer.store_for(memory)
    store.embed_missing("n", [(key, text_of(memory.get(key, namespace="n"))) for key in ENTRIES])
    memory.set("pie", "cherry pie now", namespace="n")
    result = hybrid_turn(scorer, memory, "pie")
    assert ("n", "pie") not in stored_vectors(vector_engine, prefix)
    assert result.semantic_coverage == "semantic: 4 of 5 entries embedded"
    decisions = {d.key: d for d in result.decisions}
    signals = dict(decisions["pie"].signals)  # found by weighted alone meanwhile
    assert signals["weighted rank"] == "1" and "cosine" not in signals


# -- model mismatch ----------------------------------------------------------------------------------


def test_vectors_of_another_model_are_refused(vector_engine, prefix, clock):
    memory = filled(vector_engine, prefix, clock)
    hybrid_turn(SemanticScorer(HashedWords(), embed_on_read=True), memory, "hello")
    other = SemanticScorer(HashedWords(dimension=32, model_id="bigger"), embed_on_read=True)
    restarted = SqlMemory(vector_engine, prefix=prefix, clock=clock)
    with pytest.raises(EmbeddingMismatch, match=r"hashed \(16 dimensions\).*bigger.*clawmem embed --replace"):
        other.hybrid(restarted, "hello", ["n"], int(clock()))
    # A turn goes on without memory, and says why; no vector was replaced.
    assert hybrid_turn(other, restarted, "hello").error == "EmbeddingMismatch"
    assert len(stored_vectors(vector_engine, prefix)) == 5


# -- clawmem embed --------------------------------------------------------------------------------


def cli_env(url: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    return {
        "CLAW_DATABASE_URL": url,
        "CLAW_TABLE_PREFIX": prefix,
        "CLAW_MEMORY_DRIVER": "sql",
        "CLAW_INSTANCE_PATH": str(tmp_path / "instance"),
    }


def run_embed(url: str, prefix: str, tmp_path: Path, embedder: str, *extra: str, **options: Any) -> Any:
    """Run ``clawmem embed`` in a process of its own."""
    env = {**os.environ, **cli_env(url, prefix, tmp_path), "PYTHONPATH": str(ROOT)}
    env.update(options.pop("env", {}))
    command = [sys.executable, "-c", "from clawmem.cli import main; main()", "embed", "--embedder", embedder]
    return subprocess.run([*command, *extra], capture_output=True, text=True, cwd=ROOT, env=env, **options)


def invoke(url: str, prefix: str, tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(main, list(args), env=cli_env(url, prefix, tmp_path))


@pytest.mark.parametrize("sql_backend", ["sqlite"])
def test_embed_counts_backfills_and_says_so(vector_engine, prefix, clock, url, tmp_path):
    filled(vector_engine, prefix, clock)
    assert "--dry-run" in invoke(url, prefix, tmp_path, "embed", "--help").output
    counted = "tests.embedders:counting"
    dry = invoke(url, prefix, tmp_path, "embed", "--dry-run", "--embedder", counted)
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines() == ["n: 5 to embed", "0 of 5 entries embedded; 5 to embed (dry run)"]
    assert stored_vectors(vector_engine, prefix) == {}
    done = invoke(url, prefix, tmp_path, "embed", "--embedder", counted, "--batch", "2")
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == "embedded 5 entries; 5 of 5 entries embedded"
    assert "embedding" in done.stderr  # the progress bar
    assert sorted(embedders.COUNTED[-1].texts) == sorted(ENTRIES.values())
    again = invoke(url, prefix, tmp_path, "embed", "--embedder", counted, "--namespace", "n")
    assert again.stdout.strip() == "embedded 0 entries; 5 of 5 entries embedded"
    assert embedders.COUNTED[-1].texts == []


@pytest.mark.parametrize("sql_backend", ["sqlite"])
def test_embed_refuses_another_model_unless_replacing(vector_engine, prefix, clock, url, tmp_path):
    filled(vector_engine, prefix, clock)
    assert invoke(url, prefix, tmp_path, "embed", "--embedder", "tests.embedders:counting").exit_code == 0
    other = "tests.embedders:wide"
    refused = invoke(url, prefix, tmp_path, "embed", "--embedder", other)
    assert refused.exit_code == 1
    assert "holds vectors of hashed (16 dimensions)" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert len(stored_vectors(vector_engine, prefix)) == 5  # nothing lost
    replaced = invoke(url, prefix, tmp_path, "embed", "--embedder", other, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert "deleted 5 vectors of other models" in replaced.stdout
    table = vector_table(prefix)
    with vector_engine.connect() as conn:
        assert set(conn.execute(sa.select(table.c.model_id, table.c.dimension)).all()) == {("wide", 32)}


@pytest.mark.parametrize("sql_backend", ["sqlite"])
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--embedder", "nowhere.at.all:make"], "cannot import 'nowhere.at.all'"),
        (["--embedder", "tests.embedders:missing"], "has no 'missing'"),
        (["--embedder", "no-colon"], "module:callable"),
        (["--embedder", "tests.embedders:HashedWords.__doc__"], "made no Embedder"),
        (["--batch", "0"], "0 is not in the range"),
    ],
)
def test_embed_refuses_a_bad_option_in_one_line(vector_engine, prefix, url, tmp_path, args, error):
    result = invoke(url, prefix, tmp_path, "embed", *args)
    assert result.exit_code != 0 and error in result.output


def test_embed_needs_the_vectors_table(url, prefix, tmp_path):
    engine = create_engine(url)
    create_tables(engine, prefix)
    result = invoke(url, prefix, tmp_path, "embed", "--embedder", "tests.embedders:counting")
    assert result.exit_code == 1 and "run init-db" in result.output
    operations.init_db(Site(Settings.from_mapping({"DATABASE_URL": url, "TABLE_PREFIX": prefix}, tmp_path)))
    assert invoke(url, prefix, tmp_path, "embed", "--embedder", "tests.embedders:counting").exit_code == 0
    drop_vector_table(engine, prefix)
    drop_tables(engine, prefix)
    engine.dispose()


@pytest.mark.parametrize("sql_backend", ["sqlite"])
def test_embed_resumes_after_a_kill(vector_engine, prefix, clock, url, tmp_path):
    entries = {f"k{n}": f"note number {n} about topic{n}x" for n in range(10)}
    filled(vector_engine, prefix, clock, entries)
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from clawmem.cli import main; main()",
            "embed",
            "--embedder",
            "tests.embedders:stalling",
            "--batch",
            "2",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            **cli_env(url, prefix, tmp_path),
            "PYTHONPATH": str(ROOT),
            "CLAW_TEST_STALL_FD": str(write_end),
        },
        pass_fds=(write_end,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"!"  # stuck in its third batch, two stored
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        os.close(read_end)
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    assert len(stored_vectors(vector_engine, prefix)) == 4
    resumed = invoke(url, prefix, tmp_path, "embed", "--embedder", "tests.embedders:counting")
    assert resumed.stdout.strip() == "embedded 6 entries; 10 of 10 entries embedded"
    assert len(embedders.COUNTED[-1].texts) == 6
    assert len(stored_vectors(vector_engine, prefix)) == 10


# -- the bundled encoder, offline ------------------------------------------------------------------


@pytest.mark.parametrize("sql_backend", ["sqlite"])
@pytest.mark.parametrize(
    ("embedder", "model_prefix", "dimension"), [("", "usem3-", 512), ("minilm", "all-MiniLM-L6-v2", 384)]
)
@pytest.mark.slow
def test_the_bundled_encoder_embeds_to_the_table_with_sockets_blocked(
    vector_engine, prefix, clock, url, tmp_path, monkeypatch, embedder, model_prefix, dimension
):
    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    memory = filled(vector_engine, prefix, clock, {"car": ENTRIES["car"], "pie": ENTRIES["pie"]})
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    result = invoke(url, prefix, tmp_path, "embed", *(["--embedder", embedder] if embedder else []))
    assert result.exit_code == 0, result.output
    assert "2 of 2 entries embedded" in result.stdout
    table = vector_table(prefix)
    with vector_engine.connect() as conn:
        model, stored_dimension, stored = conn.execute(
            sa.select(table.c.model_id, table.c.dimension, table.c.vector)
        ).first()
    assert model.startswith(model_prefix) and stored_dimension == dimension
    raw = bytes(stored)  # a binary column: the scale and the codes, 4 + dimension bytes
    assert len(raw) == 4 + dimension
    vector = np.frombuffer(raw[4:], dtype=np.int8) * np.frombuffer(raw[:4], dtype="<f4")[0]
    assert vector.shape == (dimension,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-2
    del memory


# -- the held vectors against a dict model -----------------------------------------------------------

KEYS = st.text(alphabet="abcxyz", min_size=1, max_size=3)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.tuples(KEYS, st.integers(-5, 5)), max_size=6)),
        st.tuples(st.just("remove"), st.lists(KEYS, max_size=4)),
    ),
    max_size=30,
)


@hypothesis_settings(max_examples=200, deadline=None)
@given(operations=OPERATIONS)
def test_the_held_vectors_equal_a_dict_model(operations):
    space = _Space(4)
    model: dict[str, tuple[int, list[float]]] = {}
    seen = {"none"}
    for operation, items in operations:
        seen.update(item if isinstance(item, str) else item[0] for item in items)
        if operation == "put":
            keys = [key for key, _ in items]
            prints = [printed for _, printed in items]
            vectors = np.asarray([[printed, len(key), 1.0, 0.0] for key, printed in items], dtype=np.float32)
            space.put_many(keys, prints, vectors.reshape(len(items), 4))
            for (key, printed), vector in zip(items, vectors.tolist(), strict=True):
                model[key] = (printed, vector)
        else:
            space.remove_many(items)
            for key in items:
                model.pop(key, None)
        assert space.size == len(model) and sorted(space.keys) == sorted(model)
        probe = sorted(seen)
        rows = space.rows_of(probe).tolist()
        for key, row in zip(probe, rows, strict=True):
            if key in model:
                assert int(space.prints[row]) == model[key][0]
                held = held_rows(space.held(np.array([row])))[0]
                assert held.tolist() == held_rows(quantise(np.array([model[key][1]])))[0].tolist()
                assert held.tolist() == pytest.approx(model[key][1], abs=max(map(abs, model[key][1])) / 254)
            else:
                assert row == -1


def test_two_drivers_in_one_process_keep_their_own_vectors():
    from clawmem.memory.array import ArrayMemory

    first, second = ArrayMemory(), ArrayMemory()
    first.set("a", "red apple", namespace="n")
    second.set("a", "yellow banana", namespace="n")
    embedder = Counting(HashedWords())
    scorer = SemanticScorer(embedder, embed_on_read=True)
    for _ in range(2):
        hybrid_turn(scorer, first, "fruit")
        hybrid_turn(scorer, second, "fruit")
    assert sorted(embedder.texts) == ["fruit", "red apple", "yellow banana"]


# -- encryption at rest ------------------------------------------------------------------------------


def sealed_memory(engine: Any, prefix: str, clock: FakeClock, keys: str | None) -> SqlMemory:
    from clawmem.crypto import Cipher, Keyring

    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    if keys is not None:
        memory.use_cipher(Cipher(Keyring.from_text(keys)), prefix)
    return memory


def stored_texts(engine: Any, prefix: str) -> dict[str, str]:
    """Return each vector as the table holds it: sealed, the ASCII of its sealed text."""
    table = vector_table(prefix)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.lookup_key, table.c.vector)).all()
    return {key: bytes(stored).decode("ascii") for key, stored in rows}


def test_with_encryption_on_the_vectors_are_sealed_and_read_back(vector_engine, prefix, clock):
    from clawmem.crypto import generate_key, is_sealed

    key = generate_key("k1")
    memory = sealed_memory(vector_engine, prefix, clock, key)
    for name, value in ENTRIES.items():
        memory.set(name, value, namespace="n")
    embedder = Counting(HashedWords())
    hybrid_turn(SemanticScorer(embedder, embed_on_read=True), memory, "hello")
    texts = stored_texts(vector_engine, prefix)
    assert len(texts) == 5 and all(is_sealed(text) for text in texts.values())
    plain = base64.b64encode(HashedWords().embed([ENTRIES["car"]])[0].tobytes()).decode()[:24]
    assert not any(plain in text for text in texts.values())
    # A restarted worker with the key reads them: nothing is embedded again.
    again = Counting(HashedWords())
    restarted = sealed_memory(vector_engine, prefix, clock, key)
    result = hybrid_turn(SemanticScorer(again, embed_on_read=True), restarted, "hello")
    assert again.texts == ["hello"] and result.semantic_coverage == "semantic: 5 of 5 entries embedded"


def test_a_sealed_vector_moved_to_another_entry_is_never_trusted(vector_engine, prefix, clock):
    from clawmem.crypto import generate_key

    key = generate_key("k1")
    memory = sealed_memory(vector_engine, prefix, clock, key)
    for name, value in ENTRIES.items():
        memory.set(name, value, namespace="n")
    hybrid_turn(SemanticScorer(HashedWords(), embed_on_read=True), memory, "hello")
    table = vector_table(prefix)
    moved = stored_texts(vector_engine, prefix)["car"]
    with vector_engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.lookup_key == "pie").values(vector=moved))
    again = Counting(HashedWords())
    restarted = sealed_memory(vector_engine, prefix, clock, key)
    hybrid_turn(SemanticScorer(again, embed_on_read=True), restarted, "hello")
    assert again.texts == ["hello", ENTRIES["pie"]]  # opened for its own place only: embedded again
