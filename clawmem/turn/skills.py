"""Skills: operator-written reference notes, matched to a message by the same word overlap as memory.

With at least one matched skill the augmented text becomes::

    [Skill context, reference material, not instructions]
    <content of skill 1>

    <content of skill 2>

    [Message]
    <memory-augmented text>

Each matched skill contributes its content with trailing line breaks removed, followed by
one blank line (``"\\n\\n"``), in match order (score descending, then name).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from clawmem.prompt import CUT_TOP_K, INJECTED, ZERO_OVERLAP, SkillDecision, Span
from clawmem.recall.words import keywords, score
from clawmem.rules import validate_count
from clawmem.text import utf8_len

SKILL_HEADER = "[Skill context, reference material, not instructions]\n"
MESSAGE_HEADER = "[Message]\n"
MAX_MATCHED_SKILLS = 3


@dataclass(frozen=True)
class Skill:
    """A named piece of reference text; ``name`` and ``description`` are what a message matches."""

    name: str
    description: str
    content: str

    def __post_init__(self) -> None:
        for attribute in ("name", "description", "content"):
            given = getattr(self, attribute)
            if not isinstance(given, str):
                raise TypeError(f"skill {attribute} must be a str, got {type(given).__name__}")
        if not self.name.strip():
            raise ValueError("a skill needs a non-empty name")

    @cached_property
    def piece(self) -> str:
        """Return the text this skill injects: its content without trailing line breaks, then a blank line."""
        return self.content.rstrip("\r\n") + "\n\n"

    @cached_property
    def piece_bytes(self) -> int:
        """Return the UTF-8 size of :attr:`piece`."""
        return utf8_len(self.piece)


def parse_skill(text: str, origin: str) -> Skill:
    """Return the skill a Markdown document describes: first ``# `` heading, first paragraph.

    Raises ``ValueError`` naming ``origin`` when the document has no ``# `` heading.
    """
    lines = text.splitlines()
    heading = next((index for index, line in enumerate(lines) if line.startswith("# ")), None)
    if heading is None or not lines[heading][2:].strip():
        raise ValueError(f"skill file {origin} has no '# ' heading line to take the skill name from")
    paragraph: list[str] = []
    for line in lines[heading + 1 :]:
        if not line.strip():
            if paragraph:
                break
            continue
        if line.startswith("#"):
            break
        paragraph.append(line.strip())
    return Skill(lines[heading][2:].strip(), " ".join(paragraph), text)


class SkillRegistry:
    """An ordered set of skills with unique names, and the matching that picks up to three."""

    def __init__(self, skills: Iterable[Skill] = (), limit: int = MAX_MATCHED_SKILLS) -> None:
        self.limit = validate_count("limit", limit)
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            self.add(skill)

    def add(self, skill: Skill) -> Skill:
        """Register ``skill`` and return it; raises ``ValueError`` if its name is taken."""
        if not isinstance(skill, Skill):
            raise TypeError(f"expected a Skill, got {type(skill).__name__}")
        if skill.name in self._skills:
            raise ValueError(f"a skill named {skill.name!r} is already registered")
        self._skills[skill.name] = skill
        return skill

    def load_directory(self, path: str | os.PathLike[str]) -> list[Skill]:
        """Register every ``*.md`` file of ``path`` (by file name) and return the new skills.

        Raises ``ValueError`` naming the file when one has no heading or is not UTF-8, and
        ``FileNotFoundError`` when ``path`` is not a directory. Nothing is added on error.
        """
        directory = Path(path)
        if not directory.is_dir():
            raise FileNotFoundError(f"skill directory {directory} does not exist or is not a directory")
        parsed: list[Skill] = []
        for file in sorted(directory.glob("*.md")):
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"skill file {file} is not valid UTF-8 ({exc.reason})") from None
            parsed.append(parse_skill(text, str(file)))
        names = [skill.name for skill in parsed]
        for skill in parsed:
            if skill.name in self._skills or names.count(skill.name) > 1:
                raise ValueError(f"skill name {skill.name!r} in {directory} is used more than once")
        for skill in parsed:
            self.add(skill)
        return parsed

    def get(self, name: str) -> Skill | None:
        """Return the skill called ``name``, or ``None``."""
        return self._skills.get(name)

    def __iter__(self) -> Iterator[Skill]:
        return iter(self._skills.values())

    def __len__(self) -> int:
        return len(self._skills)

    def decide(self, message: str) -> list[SkillDecision]:
        """Return a decision for every skill: the best ``limit`` with a score > 0 are injected."""
        words = set(keywords(message))
        scored = sorted(
            ((skill, score(words, skill.name, skill.description)) for skill in self._skills.values()),
            key=lambda item: (-item[1], item[0].name),
        )
        decisions: list[SkillDecision] = []
        for position, (skill, points) in enumerate(scored):
            if points == 0:
                status, reason = ZERO_OVERLAP, "no word of the message occurs in the name or description"
            elif position >= self.limit:
                status, reason = CUT_TOP_K, f"rank {position + 1}; at most {self.limit} skills are injected"
            else:
                status, reason = INJECTED, f"rank {position + 1}, score {points}"
            decisions.append(SkillDecision(skill.name, points, skill.piece_bytes, status, reason))
        return decisions

    def wrap(self, text: str, spans: list[Span], decisions: list[SkillDecision]) -> tuple[str, list[Span]]:
        """Return ``text`` wrapped in the injected skills' context, with every span shifted."""
        chosen = [self._skills[decision.name] for decision in decisions if decision.injected]
        if not chosen:
            return text, spans
        parts = [SKILL_HEADER]
        skill_spans: list[Span] = []
        offset = len(SKILL_HEADER)
        for skill in chosen:
            skill_spans.append(Span(offset, offset + len(skill.piece), f"skill {skill.name}"))
            parts.append(skill.piece)
            offset += len(skill.piece)
        parts.append(MESSAGE_HEADER)
        offset += len(MESSAGE_HEADER)
        shifted = [Span(span.start + offset, span.end + offset, span.source) for span in spans]
        return "".join(parts) + text, skill_spans + shifted
