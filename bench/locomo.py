"""Convert LoCoMo (``../shared/data/locomo/locomo10.json``) into ``clawmem eval``'s JSONL.

One namespace per conversation (``locomo-<n>``), one entry per observation under a neutral key
(``obs-<session>-<n>``) with its session's date as metadata ``at`` (ISO-8601), and one question
line per question of categories 1-4 (``--adversarial``: 1-5) whose evidence names at least one
observation's turn; its keys are those observations, its ``category`` the category's name
(:data:`CATEGORY_NAMES`, the data set's numbering). Conversations 0-4 are the development split
(tune and report on them only), 5-9 are held out.

    python -m bench.locomo --split dev > /tmp/locomo-dev.jsonl
    clawmem eval /tmp/locomo-dev.jsonl --by category

The data set is CC BY-NC 4.0: it is read at run time and never copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

DEFAULT_SOURCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "locomo" / "locomo10.json"
SPLITS = {"dev": range(0, 5), "held-out": range(5, 10), "all": range(0, 10)}
CATEGORIES = {1, 2, 3, 4}  # the fifth, adversarial, asks what was never said: left out unless asked
# The data set's own numbering (its README; the paper's tables list them in another order).
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def session_time(text: str) -> str:
    """Return a session's date as LoCoMo writes it ("1:56 pm on 8 May, 2023") in ISO-8601."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").isoformat()


def _session_number(name: str) -> int:
    return int(name.split("_")[1])


def convert(
    conversations: list[dict[str, Any]], indexes: range, categories: Collection[int] = CATEGORIES
) -> Iterator[dict[str, Any]]:
    """Yield the entry lines, then the question lines (of ``categories``), of the conversations
    at ``indexes``."""
    questions: list[dict[str, Any]] = []
    for index in indexes:
        if index >= len(conversations):
            break
        conversation = conversations[index]
        namespace = f"locomo-{index}"
        keys_of_turn: dict[str, list[str]] = {}
        sessions = sorted(conversation["observation"].items(), key=lambda item: _session_number(item[0]))
        for name, speakers in sessions:
            when = conversation["conversation"].get(f"session_{_session_number(name)}_date_time")
            metadata = {"at": session_time(when)} if when else None
            number = 0
            for facts in speakers.values():
                for fact in facts:
                    text, turns = fact[0], fact[1]
                    number += 1
                    key = f"obs-{_session_number(name)}-{number}"
                    for turn in [turns] if isinstance(turns, str) else turns:
                        keys_of_turn.setdefault(str(turn).strip(), []).append(key)
                    line = {"namespace": namespace, "key": key, "value": text}
                    yield line if metadata is None else {**line, "metadata": metadata}
        for qa in conversation["qa"]:
            if qa.get("category") not in categories:
                continue
            keys = sorted(
                {key for turn in qa.get("evidence", []) for key in keys_of_turn.get(turn.strip(), [])}
            )
            if keys:
                category = CATEGORY_NAMES[qa["category"]]
                questions.append(
                    {"namespace": namespace, "message": qa["question"], "keys": keys, "category": category}
                )
    yield from questions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--split", choices=sorted(SPLITS), default="dev")
    parser.add_argument("--output", type=Path, help="write here instead of standard output")
    parser.add_argument(
        "--adversarial", action="store_true", help="keep the adversarial questions (category 5) as well"
    )
    options = parser.parse_args(argv)
    if not options.source.is_file():
        print(f"LoCoMo not found at {options.source}: nothing to convert", file=sys.stderr)
        return 2
    conversations = json.loads(options.source.read_text(encoding="utf-8"))
    out = options.output.open("w", encoding="utf-8") if options.output else sys.stdout
    try:
        categories = CATEGORIES | {5} if options.adversarial else CATEGORIES
        for line in convert(conversations, SPLITS[options.split], categories):
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    finally:
        if options.output:
            out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
