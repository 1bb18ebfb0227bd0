"""Vectors embedded on write and kept beside the entries by every driver that keeps entries at
rest: sql (SQLite, MariaDB, PostgreSQL), redis and file.

Each site is built from settings, as a worker builds it; "a restart" is a new Claw from the same
settings with the process's scorers forgotten, so only what was persisted survives. Embedders
are the counting ones of :mod:`tests.embedders`, so an embedding done again is counted.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from clawmem.cli import ClawGroup
from clawmem.clock import FakeClock
from clawmem.crypto import generate_key
from clawmem.errors import CorruptStoreError
from clawmem.memory.file_vectors import BINARY_MARK, FileVectorBacking, read_meta, read_sidecar
from clawmem.memory.sql_vectors import SqlVectorBacking
from clawmem.privacy import erasure
from clawmem.privacy.subjects import Subject
from clawmem.providers.echo import EchoProvider
from clawmem.recall import fusion
from clawmem.recall.embeddings import held_rows, quantise, unit
from clawmem.recall.persisted import CODES_MARK, decode_chunk, encode_vector, print_of, print_text
from clawmem.rules import subject_namespace
from clawmem.settings import Settings
from clawmem.sites import operations, rotation
from clawmem.sites.rotation import rotate
from clawmem.sites.site import Site
from clawmem.sql.vectors import vector_table
from clawmem.turn.pipeline import Claw
from tests import embedders
from tests.conftest import backend_url, sql_url

DRIVERS = ["sql-sqlite", "sql-mysql", "sql-postgres", "redis", "file"]
COUNTING = "tests.embedders:counting"
OLD = generate_key("old1")
NEW = generate_key("new2")

ENTRIES = {
    "toronto": "she moved to Toronto in May",
    "car": "bought a new automobile last week",
    "pie": "the apple pie recipe uses butter",
}


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def fresh_scorers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no scorer, no vector held."""
    monkeypatch.setattr(fusion, "_SCORERS", {})
    monkeypatch.setattr(embedders, "COUNTED", [])


def restart() -> None:
    """Forget the process's scorers and what they hold, as a restarted worker has."""
    fusion._SCORERS.clear()


@pytest.fixture
def make_settings(driver: str, tmp_path: Path, prefix: str, request: pytest.FixtureRequest) -> Any:
    """Return a maker of the site's settings on ``driver`` (extra settings as keyword arguments)."""
    backend = driver.partition("-")[2] or "sqlite"
    values: dict[str, Any] = {
        "DATABASE_URL": sql_url(backend, tmp_path),
        "TABLE_PREFIX": prefix,
        "MEMORY_DRIVER": driver.partition("-")[0],
        "FILE_DIR": str(tmp_path / "files"),
        "RECALL_SCORING": "hybrid",
        "RECALL_EMBEDDER": COUNTING,
    }
    if driver == "redis":
        values["REDIS_URL"] = backend_url("redis")

    def make(**extra: Any) -> Settings:
        return Settings.from_mapping({**values, **extra}, instance_path=tmp_path / "instance")

    operations.init_db(Site(make()))
    yield make
    site = Site(make())
    if driver == "redis":
        redis_client = site.driver.client
        for namespace in list(site.driver.namespaces()) + [subject_namespace("cust-42"), "n"]:
            redis_client.delete(*(redis_client.keys(f"{prefix}phpclaw:{{{namespace}}}*") or ["-"]))
        redis_client.delete(f"{prefix}phpclaw:namespaces", f"{prefix}phpclaw:vectors")
    operations.uninstall(site)


def last_embedder() -> embedders.Counting:
    return embedders.COUNTED[-1]


def claw_of(settings: Settings, clock: FakeClock) -> Claw:
    return Claw.from_settings(settings, EchoProvider(), clock=clock)


def vectors_of(settings: Settings, namespace: str = "n") -> set[str]:
    """Return the keys whose vector is persisted, read from the driver's own store."""
    backing = Site(settings).driver.vector_backing()
    return set(backing.prints(namespace))


def test_writes_are_embedded_and_a_restart_embeds_nothing_again(make_settings, clock):
    settings = make_settings()
    claw = claw_of(settings, clock)
    for key, text in ENTRIES.items():
        claw.memory.set(key, text, namespace="default")
    written = last_embedder()
    assert sorted(written.texts) == sorted(ENTRIES.values())  # embedded on write, once each
    result = claw.augmenter.augment("where did she move")
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"
    assert written.texts[3:] == ["where did she move"]  # the turn embedded its message only

    restart()
    again = claw_of(settings, clock)
    result = again.augmenter.augment("where did she move")
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"
    assert last_embedder() is not written and last_embedder().texts == ["where did she move"]
    assert result.decisions[0].key == "toronto"


def test_forget_flush_sweep_expiry_and_erase_remove_vectors(make_settings, clock):
    settings = make_settings()
    site = Site(settings, clock)
    own = subject_namespace("cust-42")
    for key, text in ENTRIES.items():
        site.memory.set(key, text, namespace="n")
    site.memory.set("brief", "a short lived note", namespace="n", ttl=60)
    site.memory.set("diet", "cust-42 eats no meat", namespace=own)
    assert vectors_of(settings) == {*ENTRIES, "brief"}
    site.memory.forget("car", namespace="n")
    assert vectors_of(settings) == {"toronto", "pie", "brief"}
    clock.advance(61)
    operations.sweep(site)
    assert vectors_of(settings) == {"toronto", "pie"}
    erasure.erase_subject(site, Subject(user_id="cust-42"))
    assert vectors_of(settings, own) == set()
    site.memory.flush(namespace="n")
    assert vectors_of(settings) == set()


def test_an_expired_entry_loses_its_vector_by_the_change_feed(make_settings, clock):
    settings = make_settings()
    claw = claw_of(settings, clock)
    claw.memory.set("tea", "green tea every morning", namespace="default")
    claw.memory.set("brief", "a short lived note", namespace="default", ttl=60)
    clock.advance(61)
    result = claw.augmenter.augment("tea")  # no sweep: the turn follows the feed
    assert result.semantic_coverage == "semantic: 1 of 1 entries embedded"
    assert vectors_of(settings, "default") == {"tea"}


def test_a_failing_embedder_keeps_the_write(make_settings, clock, caplog):
    settings = make_settings(RECALL_EMBEDDER="tests.embedders:failing")
    claw = claw_of(settings, clock)
    with caplog.at_level(logging.WARNING, logger="clawmem.memory.vector_writes"):
        claw.memory.set("tea", "green tea every morning", namespace="default")
    assert claw.memory.get("tea", namespace="default") == "green tea every morning"
    assert "'tea' of namespace default is stored but not embedded yet (RuntimeError)" in caplog.text
    restart()  # the model runs again (same model id): the entry waits for clawmem embed
    result = claw_of(make_settings(), clock).augmenter.augment("green tea")
    assert result.error is None
    assert result.semantic_coverage == "semantic: 0 of 1 entries embedded"
    assert [decision.key for decision in result.decisions] == ["tea"]  # by weighted alone


def test_other_scorings_embed_nothing_on_write(make_settings, clock):
    claw = claw_of(make_settings(RECALL_SCORING="weighted"), clock)
    claw.memory.set("tea", "green tea every morning", namespace="default")
    assert embedders.COUNTED == []  # not even loaded
    assert vectors_of(make_settings(), "default") == set()


def test_vectors_of_another_model_are_refused(make_settings, clock):
    settings = make_settings()
    claw_of(settings, clock).memory.set("tea", "green tea every morning", namespace="default")
    restart()
    wide = claw_of(make_settings(RECALL_EMBEDDER="tests.embedders:wide"), clock)
    result = wide.augmenter.augment("tea")
    assert result.error == "EmbeddingMismatch"
    assert vectors_of(settings, "default") == {"tea"}  # nothing replaced


def cli(site: Site, *args: str) -> Any:
    return CliRunner().invoke(ClawGroup("clawmem", lambda: site), list(args), catch_exceptions=False)


def test_clawmem_embed_backfills_and_then_has_nothing_to_do(make_settings, clock):
    plain = Site(make_settings(RECALL_SCORING="clawmem"), clock)  # writes not embedded
    for key, text in ENTRIES.items():
        plain.memory.set(key, text, namespace="default")
    assert vectors_of(plain.settings, "default") == set()
    site = Site(make_settings(), clock)
    done = cli(site, "embed", "--embedder", COUNTING)
    assert done.exit_code == 0, done.output
    assert "embedded 3 entries; 3 of 3 entries embedded" in done.output
    assert vectors_of(site.settings, "default") == set(ENTRIES)
    again = cli(site, "embed", "--embedder", COUNTING)
    assert "embedded 0 entries; 3 of 3 entries embedded" in again.output
    restart()
    result = claw_of(site.settings, clock).augmenter.augment("automobile")
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"
    assert last_embedder().texts == ["automobile"]


def vector_status(site: Site) -> str:
    """Return what ``keys status`` says of the persisted vectors."""
    lines = cli(site, "keys", "status").output.splitlines()
    found = [line for line in lines if "vectors" in line.partition(": ")[0]]
    assert len(found) == 1, lines
    return found[0].partition(": ")[2]


def test_rotation_then_dropping_the_old_key_keeps_vectors_readable(make_settings, clock):
    old_site = make_settings(ENCRYPTION_KEYS=OLD)
    claw = claw_of(old_site, clock)
    for key, text in ENTRIES.items():
        claw.memory.set(key, text, namespace="default")
    backing = Site(old_site).driver.vector_backing()
    assert all(text.startswith("cm1$old1$") for _, _, text in backing.stored("default"))

    rotating = Site(make_settings(ENCRYPTION_KEYS=f"{NEW},{OLD}"), clock)
    assert vector_status(rotating) == "3 rows under old1, 0 plaintext rows"
    rotated = rotate(rotating)
    assert rotated.counts.get("vectors") == 3 and rotated.vectors_dropped == 0
    assert vector_status(rotating) == "3 rows under new2, 0 plaintext rows"

    restart()
    new_only = make_settings(ENCRYPTION_KEYS=NEW)
    result = claw_of(new_only, clock).augmenter.augment("where did she move")
    assert result.error is None
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"
    assert last_embedder().texts == ["where did she move"]  # every vector read, none embedded again


def test_a_vector_under_a_dropped_key_is_embedded_again_cleanly(make_settings, clock, monkeypatch):
    claw = claw_of(make_settings(ENCRYPTION_KEYS=OLD), clock)
    claw.memory.set("tea", "green tea every morning", namespace="default")
    # A rotation that left the vectors behind (as one before vectors were rotated did), then
    # the old key dropped: the vector can no longer be opened.
    with monkeypatch.context() as patched:
        patched.setattr(rotation, "_vector_batches", lambda *args: iter(()))
        rotate(Site(make_settings(ENCRYPTION_KEYS=f"{NEW},{OLD}"), clock))
    restart()
    new_only = make_settings(ENCRYPTION_KEYS=NEW)
    result = claw_of(new_only, clock).augmenter.augment("green tea")
    assert result.error is None
    assert result.semantic_coverage == "semantic: 0 of 1 entries embedded"
    assert [decision.key for decision in result.decisions] == ["tea"]  # by weighted alone
    # A rotation under the key left deletes what it cannot open; embed gives it a new vector.
    site = Site(new_only, clock)
    rotated = rotate(site)
    assert rotated.vectors_dropped == 1 and rotated.undecryptable == []
    assert vectors_of(new_only, "default") == set()
    assert "embedded 1 entries" in cli(site, "embed", "--embedder", COUNTING).output
    restart()
    result = claw_of(new_only, clock).augmenter.augment("green tea")
    assert result.semantic_coverage == "semantic: 1 of 1 entries embedded"
    assert last_embedder().texts == ["green tea"]


def _float32_text(vector: np.ndarray) -> str:
    """A vector text of the format before int8 codes: base64 of little-endian float32."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


@pytest.mark.parametrize("form", ["float32", "codes"])
@pytest.mark.parametrize("dimension", [5, 6, 16, 512])
def test_a_chunk_decodes_as_its_rows_do_one_by_one(dimension, form):
    """The load's one-call decode reads exactly what a row-by-row read does, in either format,
    refusing the same rows: a short one, an empty one, a non-finite one, a bad print, a
    character outside base64, padding inside a row."""
    rng = np.random.default_rng(dimension)
    vectors = unit(rng.standard_normal((40, dimension)).astype(np.float32))
    if form == "float32":
        mark, encode = "", _float32_text
        nan = _float32_text(np.full(dimension, np.nan))
        expected = quantise(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    else:
        mark, encode = CODES_MARK, encode_vector
        nan = CODES_MARK + base64.b64encode(np.float32(np.nan).tobytes() + bytes(dimension)).decode()
        expected = quantise(vectors)
    good = [encode(vector) for vector in vectors]
    after = len(mark)  # where the base64 begins
    prints = [print_text(int(value)) for value in rng.integers(-(2**62), 2**62, 40)]
    spoiled = [
        lambda texts, prints: texts.__setitem__(3, texts[3][:-4]),
        lambda texts, prints: texts.__setitem__(9, ""),
        lambda texts, prints: texts.__setitem__(11, nan),
        lambda texts, prints: prints.__setitem__(7, "abc"),
        lambda texts, prints: texts.__setitem__(5, mark + "!" + texts[5][after + 1 :]),
        lambda texts, prints: texts.__setitem__(13, texts[13][: after + 2] + "=" + texts[13][after + 3 :]),
        lambda texts, prints: texts.__setitem__(15, mark + "é" + texts[15][after + 1 :]),
    ]
    for spoil in [None, *spoiled]:
        texts, chunk_prints = list(good), list(prints)
        if spoil is not None:
            spoil(texts, chunk_prints)
        held, printed, ok = decode_chunk(texts, chunk_prints, dimension)
        one_by_one = [
            decode_chunk([text], [p], dimension) for text, p in zip(texts, chunk_prints, strict=True)
        ]
        assert ok.tolist() == [bool(row[2][0]) for row in one_by_one]
        assert int(ok.sum()) == (40 if spoil is None else 39)
        assert np.array_equal(held.codes[ok], expected.codes[ok])
        assert np.array_equal(held.scales[ok], expected.scales[ok])
        assert printed[ok].tolist() == [print_of(p) for p, fits in zip(chunk_prints, ok, strict=True) if fits]


def test_a_chunk_of_both_formats_decodes_each_row_by_its_own():
    """A store half converted (another worker wrote today's format beside older rows) loads as one."""
    vectors = unit(np.random.default_rng(3).standard_normal((10, 8)).astype(np.float32))
    texts = [encode_vector(v) if n % 2 else _float32_text(v) for n, v in enumerate(vectors)]
    prints = [print_text(n) for n in range(10)]
    held, printed, ok = decode_chunk(texts, prints, 8)
    assert ok.all() and printed.tolist() == list(range(10))
    assert np.allclose(held_rows(held), vectors, atol=1 / 127)
    assert np.array_equal(held.codes[1::2], quantise(vectors[1::2]).codes)


def _to_old_format(settings: Settings, namespace: str, form: str) -> None:
    """Rewrite every vector of ``namespace`` as an older clawmem stored it (sealed again when
    encryption is on): the base64 of float32 (``float32``) or the text of int8 codes
    (``codes``), in a column of text on SQL, as a table made then has."""
    backing = Site(settings).driver.vector_backing()
    ((model, dimension),) = backing.models()
    rows = list(backing.rows(namespace))
    held, _, ok = decode_chunk([text for _, _, text in rows], [p for _, p, _ in rows], dimension)
    assert ok.all()
    vectors = unit(held_rows(held))
    encode = _float32_text if form == "float32" else encode_vector
    if isinstance(backing, SqlVectorBacking):
        _text_column(backing)
    if isinstance(backing, FileVectorBacking):
        _json_file(backing, namespace)
    old = [(key, printed, encode(vector)) for (key, printed, _), vector in zip(rows, vectors, strict=True)]
    backing.save(namespace, model, dimension, old)


def _json_file(backing: FileVectorBacking, namespace: str) -> None:
    """Make the namespace's vectors file JSON, emptied, as the file driver wrote it before it was binary."""
    path = backing.driver.vectors_path(namespace)
    model = read_sidecar(path)
    path.write_text(
        json.dumps({"model_id": model["model_id"], "dimension": model["dimension"], "vectors": {}})
    )
    assert read_sidecar(path)["binary"] is False


def _text_column(backing: SqlVectorBacking) -> None:
    """Make the vectors table's column text again, emptied, as a table made before it was binary."""
    name = vector_table(backing.prefix).name
    with backing.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {name}")
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"ALTER TABLE {name} ALTER COLUMN vector TYPE text")
        elif conn.dialect.name == "mysql":
            conn.exec_driver_sql(
                f"ALTER TABLE {name} MODIFY vector MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL"
            )
    backing._binary = None  # looked up again, as by a new process
    assert backing.binary == (backing.engine.dialect.name == "sqlite")  # SQLite's text holds bytes


@pytest.mark.parametrize("form", ["float32", "codes"])
@pytest.mark.parametrize("keys", ["", OLD], ids=["plain", "sealed"])
def test_a_store_of_an_older_format_is_read_until_embed_replace_rewrites_it(make_settings, clock, keys, form):
    settings = make_settings(ENCRYPTION_KEYS=keys)
    claw = claw_of(settings, clock)
    for key, text in ENTRIES.items():
        claw.memory.set(key, text, namespace="default")
    _to_old_format(settings, "default", form)
    backing = Site(settings).driver.vector_backing()
    assert all(isinstance(text, str) for _, _, text in backing.rows("default"))
    assert all(text.startswith(CODES_MARK) == (form == "codes") for _, _, text in backing.rows("default"))

    restart()
    result = claw_of(settings, clock).augmenter.augment("where did she move")
    assert result.error is None
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"  # read, never refused
    assert last_embedder().texts == ["where did she move"]
    assert result.decisions[0].key == "toronto"

    site = Site(settings, clock)
    done = cli(site, "embed", "--embedder", COUNTING, "--replace")
    assert done.exit_code == 0, done.output
    on_sql_text = isinstance(backing, SqlVectorBacking) and backing.engine.dialect.name != "sqlite"
    on_json = isinstance(backing, FileVectorBacking)
    assert ("hold vectors as bytes" in done.output) == (on_sql_text or on_json)
    if on_json:
        assert backing.driver.vectors_path("default").read_bytes().startswith(BINARY_MARK)
    backing = Site(settings).driver.vector_backing()  # as a new process finds it
    as_bytes = backing.writes_bytes  # not sealed
    assert as_bytes == (not keys)
    rewritten = form == "float32" or as_bytes
    assert ("rewrote 3 vectors of an older format as int8 codes" in done.output) == rewritten
    if as_bytes:
        ((_, dimension),) = backing.models()
        assert all(
            isinstance(data, bytes) and len(data) == 4 + dimension for _, _, data in backing.stored("default")
        )
    else:
        assert all(text.startswith(CODES_MARK) for _, _, text in backing.rows("default"))
        assert all(text.startswith("cm1$old1$") == bool(keys) for _, _, text in backing.stored("default"))
    assert "rewrote" not in cli(site, "embed", "--embedder", COUNTING, "--replace").output  # once
    restart()
    result = claw_of(settings, clock).augmenter.augment("where did she move")
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"
    assert last_embedder().texts == ["where did she move"]  # nothing embedded again
    assert result.decisions[0].key == "toronto"


def test_uninstall_removes_the_file_drivers_vectors_with_its_files(tmp_path, prefix, clock):
    settings = Settings.from_mapping(
        {
            "DATABASE_URL": sql_url("sqlite", tmp_path),
            "TABLE_PREFIX": prefix,
            "MEMORY_DRIVER": "file",
            "FILE_DIR": str(tmp_path / "files"),
            "RECALL_SCORING": "hybrid",
            "RECALL_EMBEDDER": COUNTING,
        },
        instance_path=tmp_path / "instance",
    )
    site = Site(settings, clock)
    operations.init_db(site)
    site.memory.set("tea", "green tea every morning", namespace="default")
    listed = [path.name for path in operations.site_files(site)]
    assert "default.vectors" in listed
    operations.uninstall(site, files=True)
    assert not (tmp_path / "files").exists()


def test_a_default_hybrid_turn_reads_no_namespace_whole(make_settings, clock, monkeypatch):
    settings = make_settings()
    claw = claw_of(settings, clock)
    for key, text in ENTRIES.items():
        claw.memory.set(key, text, namespace="default")
    claw.memory.set("later", "written after the vectors were loaded", namespace="default")

    def whole_read(*args: Any) -> Any:
        raise AssertionError("a turn read a whole namespace")

    driver = claw.memory.inner
    monkeypatch.setattr(driver, "_all", whole_read)
    result = claw.augmenter.augment("where did she move")
    assert result.error is None
    assert result.semantic_coverage == "semantic: 4 of 4 entries embedded"
    assert result.decisions[0].key == "toronto"


def test_the_file_drivers_vectors_file_is_binary_and_a_damaged_one_is_refused_by_name(
    tmp_path, prefix, clock
):
    settings = Settings.from_mapping(
        {
            "DATABASE_URL": sql_url("sqlite", tmp_path),
            "TABLE_PREFIX": prefix,
            "MEMORY_DRIVER": "file",
            "FILE_DIR": str(tmp_path / "files"),
            "RECALL_SCORING": "hybrid",
            "RECALL_EMBEDDER": COUNTING,
        },
        instance_path=tmp_path / "instance",
    )
    site = Site(settings, clock)
    operations.init_db(site)
    for key, text in ENTRIES.items():
        site.memory.set(key, text, namespace="default")
    path = site.driver.vectors_path("default")
    raw = path.read_bytes()
    assert raw.startswith(BINARY_MARK)
    dimension = read_sidecar(path)["dimension"]
    assert read_meta(path)["count"] == len(ENTRIES)  # read from its first lines alone
    rows_start = raw.index(b"\n", raw.index(b"\n", len(BINARY_MARK)) + 1) + 1
    assert len(raw) - rows_start == len(ENTRIES) * (4 + dimension)  # each vector's packed bytes, no text
    restart()
    result = claw_of(settings, clock).augmenter.augment("where did she move")
    assert result.semantic_coverage == "semantic: 3 of 3 entries embedded"
    assert last_embedder().texts == ["where did she move"]  # read back, nothing embedded again
    assert result.decisions[0].key == "toronto"
    path.write_bytes(raw[:-1])  # the last row cut short
    with pytest.raises(CorruptStoreError, match=re.escape(str(path))):
        read_sidecar(path)
