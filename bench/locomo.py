"""Convert LoCoMo (``../shared/data/locomo/locomo10.json``) into ``clawmem eval``'s JSONL.

One namespace per conversation (``locomo-<n>``), one entry per observation under a neutral key
(``obs-<session>-<n>``) with its session's date as metadata ``at`` (ISO-8601), and one question
line per question of categories 1-4 (``--adversarial``: 1-5) whose evidence names at least one
observation's turn; its keys are those observations, its ``category`` the category's name
(:data:`CATEGORY_NAMES`, the data set's numbering). Conversations 0-4 are the development split
(tune and report on them only), 5-9 are held out.

    python -m bench.locomo --split dev > /tmp/locomo-dev.jsonl
    clawmem eval /tmp/locomo-dev.jsonl --by category

With ``--writes extract --provider-url URL`` it runs the conversations end to end instead:
each dialogue turn (``"<speaker>: <text>"``, a session's first turn led by its date) is one
``Claw.send`` turn of the subject ``locomo-<n>``, one clawmem conversation per session, with
``CLAW_MEMORY_WRITES=extract`` against the chat-completions server at URL. It prints a JSON
report of what was written (entries per subject, facts written, replaced, refused, answers that
wrote nothing) and what it cost (provider calls and tokens, the replies' and the extraction's
apart, seconds and CPU seconds). It costs two provider calls a turn, about 600 turns a
conversation: ``--max-turns`` bounds the turns of each conversation for a trial run.

    python -m bench.locomo --split dev --writes extract --provider-url http://127.0.0.1:8080/v1 \
        --model my-model --max-turns 40 --output /tmp/locomo-writes.json

The data set is CC BY-NC 4.0: it is read at run time and never copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
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


def dialogue(conversation: dict[str, Any]) -> Iterator[list[str]]:
    """Yield each session of a LoCoMo conversation, in order, as the user messages of its turns:
    ``"<speaker>: <text>"``, the first led by the session's date when it has one."""
    sessions = conversation["conversation"]
    names = sorted(
        (name for name in sessions if name.startswith("session_") and isinstance(sessions[name], list)),
        key=_session_number,
    )
    for name in names:
        said = [f"{turn['speaker']}: {turn['text']}" for turn in sessions[name] if turn.get("text")]
        date = sessions.get(f"{name}_date_time")
        if said and isinstance(date, str):
            said[0] = f"[{date}] {said[0]}"
        yield said


def run_writes(
    conversations: list[dict[str, Any]], indexes: range, options: argparse.Namespace
) -> dict[str, Any]:
    """Run the conversations at ``indexes`` through ``Claw.send`` with extraction (see the
    module docstring) and return the report. Raises :class:`clawmem.errors.ProviderError` when
    a turn's reply call fails (an extraction's failure never fails its turn)."""
    from clawmem.memory.wrappers import namespaces_any
    from clawmem.providers import OpenAICompatibleProvider
    from clawmem.recall.sources import serving_driver
    from clawmem.rules import subject_namespace
    from clawmem.settings import Settings
    from clawmem.sites.operations import init_db
    from clawmem.sites.site import Site
    from clawmem.turn.pipeline import Claw, billed_tokens

    instance = options.instance or Path(tempfile.mkdtemp(prefix="locomo-writes-"))
    settings = Settings(
        instance_path=str(instance),
        database_url=options.database_url or f"sqlite:///{instance / 'locomo.db'}",
        table_prefix=options.table_prefix,
        memory_writes="extract",
    )
    init_db(Site(settings))
    api_key = os.environ.get(options.api_key_env) if options.api_key_env else None
    provider = OpenAICompatibleProvider(options.provider_url, options.model, api_key, options.timeout)
    claw = Claw.from_settings(settings, provider)
    totals = {
        "turns": 0,
        "reply_calls": 0,
        "reply_tokens": 0,
        "extraction_calls": 0,
        "extraction_tokens": 0,
        "facts_written": 0,
        "facts_refused": 0,
        "answers_writing_nothing": 0,
        "tokens_not_reported": 0,
    }
    subjects: list[dict[str, Any]] = []
    started, cpu = time.perf_counter(), time.process_time()
    for index in indexes:
        if index >= len(conversations):
            break
        user_id = f"locomo-{index}"
        turns = 0
        for said in dialogue(conversations[index]):
            conversation_id = None
            for message in said:
                if options.max_turns is not None and turns >= options.max_turns:
                    break
                reply = claw.send(message, conversation_id, user_id=user_id)
                conversation_id = reply.conversation_id
                turns += 1
                totals["turns"] += 1
                totals["reply_calls"] += reply.provider_calls
                spent = billed_tokens(reply.usage)
                totals["reply_tokens"] += spent or 0
                totals["tokens_not_reported"] += spent is None
                extraction = reply.extraction
                if extraction is None:
                    continue
                totals["extraction_calls"] += 1
                writing = billed_tokens(extraction.usage)
                totals["extraction_tokens"] += writing or 0
                totals["tokens_not_reported"] += writing is None
                totals["facts_written"] += len(extraction.facts)
                totals["facts_refused"] += len(extraction.refused)
                totals["answers_writing_nothing"] += extraction.error is not None
        namespace = subject_namespace(user_id, settings.subject_namespace)
        driver, _ = serving_driver(claw.memory, namespace)
        held = driver.all(namespace) if namespace in namespaces_any(driver) else {}
        replaced = 0
        for key in held:
            row = driver.entry(namespace, key)  # type: ignore[attr-defined]
            history = (row.metadata or {}).get("history") if row is not None else None
            replaced += len(history) if isinstance(history, list) else 0
        subject: dict[str, Any] = {
            "user_id": user_id,
            "turns": turns,
            "entries": len(held),
            "replaced": replaced,
        }
        if options.show_entries:
            subject["written"] = held
        subjects.append(subject)
    totals["seconds"] = round(time.perf_counter() - started, 3)
    totals["cpu_seconds"] = round(time.process_time() - cpu, 3)
    totals["entries"] = sum(subject["entries"] for subject in subjects)
    totals["provider_calls"] = totals["reply_calls"] + totals["extraction_calls"]
    totals["tokens"] = totals["reply_tokens"] + totals["extraction_tokens"]
    return {"database": settings.database_url, "model": options.model, "totals": totals, "subjects": subjects}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--split", choices=sorted(SPLITS), default="dev")
    parser.add_argument("--output", type=Path, help="write here instead of standard output")
    parser.add_argument(
        "--writes", choices=("off", "extract"), default="off", help="extract: run the turns end to end"
    )
    parser.add_argument("--provider-url", help="the chat-completions server (with --writes extract)")
    parser.add_argument("--model", default="default", help="the model name sent to the provider")
    parser.add_argument("--api-key-env", help="the environment variable holding the provider's API key")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a provider call may take")
    parser.add_argument("--max-turns", type=int, help="turns of each conversation to run at most")
    parser.add_argument("--database-url", help="where to write (default: a new SQLite file)")
    parser.add_argument("--instance", type=Path, help="the instance directory (default: a new one)")
    parser.add_argument("--table-prefix", default="locomo_", help="the tables' prefix")
    parser.add_argument("--show-entries", action="store_true", help="list each subject's entries")
    parser.add_argument(
        "--adversarial", action="store_true", help="keep the adversarial questions (category 5) as well"
    )
    options = parser.parse_args(argv)
    if options.writes == "extract" and not options.provider_url:
        print("--writes extract needs --provider-url URL: no model runs here", file=sys.stderr)
        return 2
    if options.max_turns is not None and options.max_turns < 1:
        print(f"--max-turns must be 1 or more, got {options.max_turns}", file=sys.stderr)
        return 2
    if not options.source.is_file():
        print(f"LoCoMo not found at {options.source}: nothing to convert", file=sys.stderr)
        return 2
    conversations = json.loads(options.source.read_text(encoding="utf-8"))
    if options.writes == "extract":
        from clawmem.errors import ProviderError

        try:
            report = run_writes(conversations, SPLITS[options.split], options)
        except (ProviderError, ValueError) as exc:
            print(f"locomo --writes extract stopped: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        text = json.dumps(report, ensure_ascii=False, indent=2) + "\n"
        if options.output:
            options.output.write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
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
