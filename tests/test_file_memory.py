"""FileMemory beyond the shared contract: cross-process locking, corrupt files, permissions,
file and site directory naming, sweeping and unusable directories."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import clawmem
from clawmem.clock import FakeClock
from clawmem.memory.file import FileMemory, namespace_file_stem, namespace_of_stem, site_directory_name

WORKERS = 4
STEPS = 200


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    """``CLAW_FILE_DIR``: it holds one directory per site."""
    return tmp_path / "memory"


@pytest.fixture
def site_dir(directory: Path) -> Path:
    """The default site's directory, where ``memory`` keeps its files."""
    return directory / "default-site"


@pytest.fixture
def memory(directory: Path, clock: FakeClock) -> FileMemory:
    return FileMemory(directory, clock=clock)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in ``directory`` with its bytes and modification time."""
    return {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in sorted(directory.iterdir())}


def stored_keys(path: Path) -> list[str]:
    """The keys physically present in a namespace file, expired or not."""
    return sorted(json.loads(path.read_bytes()))


# -- concurrent writers ------------------------------------------------------------------------


def _set_own_keys(directory: str, worker: int, barrier: Any) -> None:
    memory = FileMemory(directory)
    barrier.wait()
    for step in range(1, STEPS + 1):
        memory.set(f"counter-{worker}", step, namespace="shared")
        memory.set(f"step-{worker}-{step:03d}", step, namespace="shared")


def _increment_shared(directory: str, worker: int, barrier: Any) -> None:
    memory = FileMemory(directory)
    barrier.wait()
    for _ in range(STEPS):
        memory.update("total", lambda current: (current or 0) + 1, namespace="shared")


def _run_workers(target: Any, directory: Path) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS)
    workers = [context.Process(target=target, args=(str(directory), n, barrier)) for n in range(WORKERS)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [process.exitcode for process in workers] == [0] * WORKERS


@pytest.mark.slow
def test_concurrent_processes_writing_one_namespace_lose_no_key(directory: Path) -> None:
    _run_workers(_set_own_keys, directory)
    entries = FileMemory(directory).all("shared")
    for worker in range(WORKERS):
        assert entries[f"counter-{worker}"] == STEPS
        for step in range(1, STEPS + 1):
            assert entries[f"step-{worker}-{step:03d}"] == step
    assert len(entries) == WORKERS * (STEPS + 1)


@pytest.mark.slow
def test_concurrent_updates_of_one_counter_all_count(directory: Path) -> None:
    _run_workers(_increment_shared, directory)
    assert FileMemory(directory).get("total", "shared") == WORKERS * STEPS


def test_update_returns_the_new_value_and_keeps_the_ttl_rules(memory: FileMemory, clock: FakeClock) -> None:
    assert memory.update("n", lambda current: [current]) == [None]
    memory.set("n", 5, ttl=10)
    assert memory.update("n", lambda current: current + 1, ttl=3) == 6
    clock.advance(3)
    assert memory.get("n") is None
    assert memory.update("n", lambda current: current) is None
    assert memory.has("n")


def test_update_that_raises_writes_nothing(memory: FileMemory) -> None:
    memory.set("n", 1)

    def refuse(current: Any) -> Any:
        raise LookupError("no")

    with pytest.raises(LookupError):
        memory.update("n", refuse)
    with pytest.raises(ValueError, match="'n'"):
        memory.update("n", lambda current: float("nan"))
    assert memory.all() == {"n": 1}


# -- corrupt files -----------------------------------------------------------------------------

CORRUPT = [
    b"",
    b"not json",
    b"\xff\xfe{}",
    b"[1, 2]",
    b"null",
    b'{"k": {"value": 1, "expires_at": null}',
    b'{"k": {"value": "\xff"}}',
    b"[" * 990 + b"]" * 990,
]


@pytest.mark.parametrize("content", CORRUPT, ids=[repr(c)[:24] for c in CORRUPT])
def test_corrupt_file_raises_naming_the_file_and_is_left_alone(memory: FileMemory, content: bytes) -> None:
    memory.set("k", "before")
    path = memory.path_for("default")
    path.write_bytes(content)
    operations = {
        "get": lambda: memory.get("k"),
        "has": lambda: memory.has("k"),
        "set": lambda: memory.set("k", "after"),
        "all": lambda: memory.all(),
        "forget": lambda: memory.forget("k"),
        "flush": lambda: memory.flush(),
        "search": lambda: memory.search("before"),
        "sweep": lambda: memory.sweep(),
        "update": lambda: memory.update("k", lambda current: "after"),
    }
    for operation, call in operations.items():
        with pytest.raises(clawmem.StorageError) as raised:
            call()
        assert str(path) in str(raised.value)
        assert (raised.value.driver, raised.value.operation) == ("file", operation)
        assert path.read_bytes() == content
    memory.set("k", "fine", namespace="other")
    assert memory.get("k", "other") == "fine"


UNREADABLE_ENTRIES = [
    b'{"k": 1, "ok": {"value": 2, "expires_at": null}}',
    b'{"k": {"expires_at": null}, "ok": {"value": 2, "expires_at": null}}',
    b'{"k": {"value": 1, "expires_at": "soon"}, "ok": {"value": 2, "expires_at": null}}',
    b'{"k": {"value": NaN, "expires_at": null}, "ok": {"value": 2, "expires_at": null}}',
    b'{"k": {"value": [1e999], "expires_at": null}, "ok": {"value": 2, "expires_at": null}}',
]


@pytest.mark.parametrize("content", UNREADABLE_ENTRIES, ids=[repr(c)[:32] for c in UNREADABLE_ENTRIES])
def test_an_unreadable_entry_fails_only_its_own_reads_and_is_kept(memory: FileMemory, content: bytes) -> None:
    memory.set("seed", 0)
    path = memory.path_for("default")
    path.write_bytes(content)
    for operation, call in {
        "get": lambda: memory.get("k"),
        "has": lambda: memory.has("k"),
        "update": lambda: memory.update("k", lambda current: "after"),
    }.items():
        with pytest.raises(clawmem.StorageError) as raised:
            call()
        assert (raised.value.driver, raised.value.operation) == ("file", operation)
        assert str(path) in str(raised.value) and "'k'" in str(raised.value)
        assert path.read_bytes() == content
    assert memory.all() == {"ok": 2} and memory.search("k") == []
    memory.set("new", 3)
    assert memory.all() == {"new": 3, "ok": 2}
    assert [row.key for row in memory.records() if row.unreadable] == ["k"]
    memory.set("k", "replaced")
    assert memory.get("k") == "replaced"


# -- permissions -------------------------------------------------------------------------------


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    yield
    os.umask(previous)


def test_directory_is_0700_and_files_0600_even_with_an_open_umask(
    tmp_path: Path, clock: FakeClock, open_umask: None
) -> None:
    directory = tmp_path / "instance" / "memory"
    memory = FileMemory(directory, clock=clock)
    assert not directory.exists()
    memory.set("k", "v")
    memory.set("k", "v", namespace="Other:ns")
    memory.forget("k", namespace="Other:ns")
    memory.set("k", "v", namespace="Other:ns")
    assert [path.name for path in directory.iterdir()] == ["default-site"]
    for private in (directory, directory / "default-site"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o700, private
    names = sorted(path.name for path in memory.directory.iterdir())
    assert names == ["_other_2ns.json", "_other_2ns.lock", "default.json", "default.lock"]
    for path in memory.directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_each_site_has_a_0700_directory_of_its_own(
    tmp_path: Path, clock: FakeClock, open_umask: None
) -> None:
    directory = tmp_path / "memory"
    for site in ["", "wp_", "wp_2_"]:
        FileMemory(directory, clock=clock, site=site).set("k", site)
    assert sorted(path.name for path in directory.iterdir()) == ["default-site", "site-wp_", "site-wp_2_"]
    for site_path in directory.iterdir():
        assert stat.S_IMODE(site_path.stat().st_mode) == 0o700, site_path.name
        assert sorted(path.name for path in site_path.iterdir()) == ["default.json", "default.lock"]
    assert FileMemory(directory, clock=clock, site="wp_2_").all() == {"k": "wp_2_"}


def test_reads_and_deleting_nothing_create_nothing(memory: FileMemory, directory: Path) -> None:
    assert memory.get("k") is None
    assert memory.all() == {}
    memory.forget("k")
    memory.flush("other")
    assert memory.sweep() == {}
    assert memory.namespaces() == []
    assert not directory.exists()


# -- file names --------------------------------------------------------------------------------

TRICKY = ["a", "A", "a:b", "a.b", "a_b", "a-b", ".a", "a.", "_a", "a_", "-", ":", "_", "default", "DEFAULT"]


def test_namespace_file_names_are_injective_and_stay_inside_the_directory(
    memory: FileMemory, site_dir: Path
) -> None:
    paths = [memory.path_for(namespace) for namespace in TRICKY]
    assert len({path.name.casefold() for path in paths}) == len(TRICKY)
    for path in paths:
        assert path.parent == site_dir
        assert re.fullmatch(r"[a-z0-9_]+\.json", path.name)
    for namespace in TRICKY:
        memory.set("which", namespace, namespace=namespace)
    assert {namespace: memory.get("which", namespace) for namespace in TRICKY} == {n: n for n in TRICKY}
    assert memory.namespaces() == sorted(TRICKY)
    assert len(list(site_dir.glob("*.json"))) == len(TRICKY)


def test_longest_namespace_fits_a_file_name(memory: FileMemory) -> None:
    namespace = "A_" * 50
    memory.set("k", 1, namespace=namespace)
    assert len(memory.path_for(namespace).name) <= 255
    assert memory.all(namespace) == {"k": 1}


NAMESPACES = st.from_regex(r"[A-Za-z0-9_.:\-]{1,100}", fullmatch=True).filter(lambda n: ".." not in n)


@given(NAMESPACES)
def test_file_stem_decodes_back_to_its_namespace(namespace: str) -> None:
    stem = namespace_file_stem(namespace)
    assert namespace_of_stem(stem) == namespace
    assert stem == stem.lower()
    assert re.fullmatch(r"[a-z0-9_]+", stem)


PREFIXES = st.from_regex(r"[A-Za-z0-9_]{0,20}", fullmatch=True)


def test_site_directory_names_read_as_the_prefix() -> None:
    assert [site_directory_name(site) for site in ["", "wp_", "wp_2_", "WP_"]] == [
        "default-site",
        "site-wp_",
        "site-wp_2_",
        "site--w-p_",
    ]


@given(PREFIXES, PREFIXES)
def test_site_directory_names_are_injective_and_case_safe(site: str, other_site: str) -> None:
    name, other_name = site_directory_name(site), site_directory_name(other_site)
    assert re.fullmatch(r"[a-z0-9_-]+", name) and name not in (".", "..")
    assert (name.casefold() == other_name.casefold()) == (site == other_site)


@pytest.mark.parametrize("site", ["../x", "a/b", "wp-", "x" * 21, None])
def test_a_site_that_is_not_a_table_prefix_is_refused(tmp_path: Path, site: Any) -> None:
    with pytest.raises(clawmem.ConfigError, match="table prefix"):
        FileMemory(tmp_path, site=site)
    assert list(tmp_path.iterdir()) == []


def test_foreign_files_in_the_directory_are_ignored(
    memory: FileMemory, directory: Path, site_dir: Path
) -> None:
    memory.set("k", 1, ttl=5)
    for name in ["notes.txt", "README.json", ".tmp-abc.json", "a__.json", "x_9.json", "a_1_1.json"]:
        (site_dir / name).write_text("not ours")
    # Namespace files straight in CLAW_FILE_DIR belong to no site.
    (directory / "default.json").write_text('{"k": {"value": "stray", "expires_at": 1}}')
    assert memory.namespaces() == ["default"]
    assert memory.sweep(dry_run=True) == {}


# -- sweeping and inline pruning ---------------------------------------------------------------


def test_sweep_prunes_every_namespace_file_and_dry_run_changes_no_byte(
    memory: FileMemory, site_dir: Path, clock: FakeClock
) -> None:
    for namespace in ["default", "a:b", "A"]:
        memory.set("old", 1, namespace=namespace, ttl=5)
        memory.set("older", 2, namespace=namespace, ttl=1)
        memory.set("fresh", 3, namespace=namespace, ttl=500)
    memory.set("gone", 4, namespace="only-expired", ttl=5)
    memory.set("forever", 5, namespace="a:b")
    clock.advance(10)
    before = snapshot(site_dir)
    expected = {"A": 2, "a:b": 2, "default": 2, "only-expired": 1}
    assert memory.sweep(dry_run=True) == expected
    assert snapshot(site_dir) == before
    assert memory.sweep() == expected
    assert stored_keys(memory.path_for("default")) == ["fresh"]
    assert stored_keys(memory.path_for("A")) == ["fresh"]
    assert stored_keys(memory.path_for("a:b")) == ["forever", "fresh"]
    assert not memory.path_for("only-expired").exists()
    assert memory.sweep() == {}


def test_set_and_forget_prune_expired_entries_inline(memory: FileMemory, clock: FakeClock) -> None:
    memory.set("short", 1, ttl=1)
    memory.set("also-short", 2, ttl=1)
    memory.set("keep", 3)
    clock.advance(1)
    memory.set("new", 4)
    assert stored_keys(memory.path_for("default")) == ["keep", "new"]
    memory.set("short", 1, ttl=1)
    clock.advance(1)
    memory.forget("never-there")
    assert stored_keys(memory.path_for("default")) == ["keep", "new"]


def test_forgetting_the_last_key_removes_the_file_but_never_the_lock(
    memory: FileMemory, site_dir: Path
) -> None:
    memory.set("k", 1)
    memory.forget("k")
    assert sorted(path.name for path in site_dir.iterdir()) == ["default.lock"]
    memory.set("k", 1)
    memory.flush()
    assert sorted(path.name for path in site_dir.iterdir()) == ["default.lock"]


def test_no_temporary_file_is_left_behind(memory: FileMemory, site_dir: Path) -> None:
    for step in range(20):
        memory.set(f"k{step}", step)
    assert sorted(path.name for path in site_dir.iterdir()) == ["default.json", "default.lock"]


# -- unusable directories ----------------------------------------------------------------------


@pytest.fixture
def read_only(directory: Path, site_dir: Path) -> Iterator[Path]:
    """``directory`` whose default site's directory is unwritable; as root via the immutable
    attribute, which root obeys."""
    site_dir.mkdir(mode=0o700, parents=True)
    (site_dir / "default.json").write_text('{"k": {"value": "kept", "expires_at": null}}')
    if os.geteuid() == 0:
        chattr = shutil.which("chattr")
        made = chattr and subprocess.run([chattr, "+i", str(site_dir)], capture_output=True).returncode == 0
        if not made:
            pytest.skip("running as root, and this file system cannot make a directory immutable")
        yield directory
        subprocess.run([chattr, "-i", str(site_dir)], check=True)
    else:
        site_dir.chmod(0o500)
        yield directory
        site_dir.chmod(0o700)


def test_unwritable_directory_raises_memory_error(read_only: Path, clock: FakeClock) -> None:
    memory = FileMemory(read_only, clock=clock)
    assert memory.get("k") == "kept"
    for operation, call in {
        "set": lambda: memory.set("k", "new"),
        "forget": lambda: memory.forget("k"),
        "flush": lambda: memory.flush(),
        "update": lambda: memory.update("k", lambda current: "new"),
    }.items():
        with pytest.raises(clawmem.StorageError) as raised:
            call()
        assert (raised.value.driver, raised.value.operation) == ("file", operation)
        assert isinstance(raised.value.__cause__, OSError)
    assert memory.get("k") == "kept"


@pytest.mark.parametrize("layout", ["directory is a file", "parent is a file"])
def test_directory_that_cannot_exist_raises_memory_error(
    tmp_path: Path, clock: FakeClock, layout: str
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory belongs")
    memory = FileMemory(blocker if layout == "directory is a file" else blocker / "memory", clock=clock)
    with pytest.raises(clawmem.StorageError, match="set failed"):
        memory.set("k", 1)
    with pytest.raises(clawmem.StorageError, match="get failed"):
        memory.get("k")
    assert blocker.read_text() == "a file where a directory belongs"
