"""``clawmem eval --by category``, and LoCoMo's conversion into eval lines (on a made-up
conversation of LoCoMo's shape: the data set itself is never copied here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.locomo import CATEGORY_NAMES, convert, session_time
from clawmem.cli import main
from clawmem.recall.eval import parse


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


FIXTURE = [
    {"namespace": "n", "key": "a", "value": "apple pie recipe", "metadata": {"at": "2023-05-08T13:56:00"}},
    {"namespace": "n", "key": "b", "value": "banana bread"},
    {"namespace": "n", "key": "c", "value": "apple tart"},
    {"namespace": "n", "message": "apple pie", "keys": ["a"], "category": "single-hop"},  # rank 1
    {"namespace": "n", "message": "banana", "keys": ["b"], "category": "single-hop"},  # rank 1
    {"namespace": "n", "message": "apple", "keys": ["c"], "category": "temporal"},  # a, c tie: rank 2
    {"namespace": "n", "message": "cherry", "keys": ["b"], "category": "temporal"},  # no candidate
    {"namespace": "n", "message": "bread", "keys": ["b"]},  # no category: rank 1
]


def test_eval_by_category_prints_each_categorys_figures_under_the_overall_line(tmp_path):
    path = _write(tmp_path / "fixture.jsonl", FIXTURE)
    args = ["eval", str(path), "--scoring", "clawmem", "--top-k", "2", "--by", "category"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[1] == ["scoring", "category", "questions", "recall@1", "recall@2", "recall@3", "MRR"]
    # all: recall@1 3/5, @2 and @3 4/5, MRR (1 + 1 + 1/2 + 0 + 1) / 5
    assert lines[2] == ["clawmem", "all", "5", "0.600", "0.800", "0.800", "0.700"]
    assert lines[3] == ["clawmem", "(none)", "1", "1.000", "1.000", "1.000", "1.000"]
    assert lines[4] == ["clawmem", "single-hop", "2", "1.000", "1.000", "1.000", "1.000"]
    # temporal: "apple" finds c second, "cherry" nothing: MRR (1/2 + 0) / 2
    assert lines[5] == ["clawmem", "temporal", "2", "0.000", "0.500", "0.500", "0.250"]
    assert len(lines) == 6


def test_eval_without_by_prints_one_line_a_scoring(tmp_path):
    path = _write(tmp_path / "fixture.jsonl", FIXTURE)
    result = CliRunner().invoke(main, ["eval", str(path), "--scoring", "clawmem", "--scoring", "weighted"])
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["scoring", "clawmem", "weighted"]
    assert "category" not in result.stdout


def test_an_entrys_metadata_is_read_with_it():
    entries, questions = parse(json.dumps(line) for line in FIXTURE)
    assert entries[0].metadata == {"at": "2023-05-08T13:56:00"} and entries[1].metadata is None
    assert [q.category for q in questions] == ["single-hop", "single-hop", "temporal", "temporal", None]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({"namespace": "n", "message": "hi", "keys": ["a"], "category": 2}, "line 1: 'category' must be"),
        ({"namespace": "n", "key": "a", "value": "x", "metadata": ["at"]}, "line 1: 'metadata' must be"),
    ],
)
def test_a_bad_category_or_metadata_is_refused_in_one_line(tmp_path, line, error):
    path = _write(tmp_path / "bad.jsonl", [line, {"namespace": "n", "message": "x", "keys": ["a"]}])
    result = CliRunner().invoke(main, ["eval", str(path), "--scoring", "clawmem", "--by", "category"])
    assert result.exit_code == 1
    assert error in result.output and len(result.output.strip().splitlines()) == 1


def _conversation() -> dict:
    """A made-up conversation in LoCoMo's shape: two sessions, one question of each category."""
    return {
        "conversation": {
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_2_date_time": "10:04 am on 9 June, 2023",
        },
        "observation": {
            "session_2_observation": {"Ann": [["Ann moved to Oslo.", "D2:1"]]},
            "session_1_observation": {
                "Ann": [["Ann bought a bike.", "D1:2"]],
                "Bo": [["Bo sings.", ["D1:3"]]],
            },
        },
        "qa": [
            {
                "question": "What did Ann buy and where did she go?",
                "evidence": ["D1:2", "D2:1"],
                "category": 1,
            },
            {"question": "When did Ann move?", "evidence": ["D2:1"], "category": 2},
            {"question": "Would Bo join a choir?", "evidence": ["D1:3"], "category": 3},
            {"question": "What does Bo do?", "evidence": ["D1:3"], "category": 4},
            {"question": "What did Bo buy?", "evidence": ["D1:2"], "category": 5},
            {"question": "What is unanswered?", "evidence": ["D9:9"], "category": 4},
        ],
    }


def test_locomo_lines_carry_the_category_by_name_and_each_sessions_date():
    lines = list(convert([_conversation()], range(0, 1)))
    entries = [line for line in lines if "key" in line]
    assert [(e["key"], e["metadata"]["at"]) for e in entries] == [
        ("obs-1-1", "2023-05-08T13:56:00"),
        ("obs-1-2", "2023-05-08T13:56:00"),
        ("obs-2-1", "2023-06-09T10:04:00"),
    ]
    questions = [(q["category"], q["keys"]) for q in lines if "message" in q]
    assert questions == [
        ("multi-hop", ["obs-1-1", "obs-2-1"]),
        ("temporal", ["obs-2-1"]),
        ("open-domain", ["obs-1-2"]),
        ("single-hop", ["obs-1-2"]),
    ]  # the adversarial one is left out, and the one whose evidence names no observation
    adversarial = [q for q in convert([_conversation()], range(0, 1), set(CATEGORY_NAMES)) if "message" in q]
    assert adversarial[-1] == {
        "namespace": "locomo-0",
        "message": "What did Bo buy?",
        "keys": ["obs-1-1"],
        "category": "adversarial",
    }


def test_a_session_date_is_read_as_locomo_writes_it():
    assert session_time("12:09 am on 13 September, 2023") == "2023-09-13T00:09:00"
    with pytest.raises(ValueError):
        session_time("yesterday")
