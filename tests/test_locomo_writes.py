"""``bench.locomo --writes extract``: LoCoMo's shape run end to end with extraction against the
local chat-completions server, on a tiny conversation of the test's own (never LoCoMo's data),
reporting what was written and what it cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bench import locomo
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import create_engine

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

pytest_plugins = ["tests.loopback"]

# A conversation in LoCoMo's shape, written for this test: two sessions, three turns.
TINY = [
    {
        "conversation": {
            "speaker_a": "Rui",
            "speaker_b": "Mara",
            "session_1_date_time": "1:00 pm on 3 May, 2023",
            "session_1": [
                {"speaker": "Rui", "dia_id": "D1:1", "text": "I adopted a cat called Miso last week."},
                {"speaker": "Mara", "dia_id": "D1:2", "text": "Lovely! Is Miso settling in?"},
            ],
            "session_2_date_time": "9:30 am on 20 May, 2023",
            "session_2": [{"speaker": "Rui", "dia_id": "D2:1", "text": "We moved to Porto from Lisbon."}],
        },
        "observation": {},
        "qa": [],
    }
]


def facts(*pairs: tuple[str, str]) -> str:
    return json.dumps({"facts": [{"key": key, "value": value} for key, value in pairs]})


def _run(tmp_path: Path, *extra: str) -> int:
    source = tmp_path / "tiny.json"
    source.write_text(json.dumps(TINY), encoding="utf-8")
    return locomo.main(["--source", str(source), "--split", "dev", "--instance", str(tmp_path), *extra])


def test_extraction_end_to_end_reports_what_was_written_and_what_it_cost(
    tmp_path: Path, loopback: LoopbackCompletions
) -> None:
    loopback.script(
        "Noted.",
        facts(("pet", "a cat called Miso")),
        "Noted.",
        "I cannot answer in JSON today.",  # an answer that writes nothing
        "Noted.",
        facts(("city", "Porto"), ("previous_city", "Lisbon")),
    )
    report_path = tmp_path / "report.json"

    code = _run(
        tmp_path,
        "--writes",
        "extract",
        "--provider-url",
        loopback.url,
        "--model",
        "local-model",
        "--output",
        str(report_path),
        "--show-entries",
    )

    assert code == 0
    report = json.loads(report_path.read_text(encoding="utf-8"))
    totals = report["totals"]
    # Six calls, whose usage is 107 + n tokens each (tests/loopback.py): n = 1..6.
    assert {
        name: totals[name] for name in ("turns", "reply_calls", "extraction_calls", "provider_calls")
    } == {
        "turns": 3,
        "reply_calls": 3,
        "extraction_calls": 3,
        "provider_calls": 6,
    }
    assert totals["reply_tokens"] == 108 + 110 + 112
    assert totals["extraction_tokens"] == 109 + 111 + 113
    assert totals["tokens"] == sum(107 + n for n in range(1, 7))
    assert (totals["facts_written"], totals["answers_writing_nothing"], totals["entries"]) == (3, 1, 3)
    (subject,) = report["subjects"]
    assert subject["user_id"] == "locomo-0" and subject["turns"] == 3
    assert subject["written"] == {"pet": "a cat called Miso", "city": "Porto", "previous_city": "Lisbon"}
    # Each turn went out as the speaker's line, a session's first led by its date.
    users = [request[-1]["content"] for request in loopback.requests[::2]]
    assert users[0].endswith("[1:00 pm on 3 May, 2023] Rui: I adopted a cat called Miso last week.")
    assert users[1].endswith("Mara: Lovely! Is Miso settling in?")
    # The entries are ordinary, attributed entries of the subject's namespace.
    engine = create_engine(report["database"])
    row = SqlMemory(engine, prefix="locomo_").entry("user:locomo-0", "pet")
    assert row is not None and row.metadata["origin"] == "extract"
    engine.dispose()


def test_max_turns_bounds_each_conversation(tmp_path: Path, loopback: LoopbackCompletions) -> None:
    loopback.script("Noted.", facts(("pet", "a cat called Miso")))
    report_path = tmp_path / "report.json"

    assert (
        _run(
            tmp_path,
            "--writes",
            "extract",
            "--provider-url",
            loopback.url,
            "--max-turns",
            "1",
            "--output",
            str(report_path),
        )
        == 0
    )

    totals = json.loads(report_path.read_text(encoding="utf-8"))["totals"]
    assert (totals["turns"], totals["provider_calls"], totals["entries"]) == (1, 2, 1)
    assert len(loopback.bodies) == 2


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--writes", "extract"), "--writes extract needs --provider-url URL: no model runs here"),
        (
            ("--writes", "extract", "--provider-url", "http://127.0.0.1:9/v1", "--max-turns", "0"),
            "--max-turns must be 1 or more, got 0",
        ),
    ],
)
def test_bad_options_say_so_in_one_line_and_run_nothing(
    tmp_path: Path, capsys: Any, extra: tuple[str, ...], said: str
) -> None:
    assert _run(tmp_path, *extra) == 2
    assert capsys.readouterr().err.strip() == said
    assert not (tmp_path / "locomo.db").exists()


def test_a_failing_provider_stops_the_run_with_one_line(
    tmp_path: Path, loopback: LoopbackCompletions, capsys: Any
) -> None:
    from tests.loopback import failing

    loopback.script(failing(500))

    assert _run(tmp_path, "--writes", "extract", "--provider-url", loopback.url) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("locomo --writes extract stopped: ") and "\n" not in error
