"""Guards that scan the augmented text of a turn before it reaches the provider.

Because the scan covers the augmented text, a recalled memory entry can block a turn whose
user message is clean; each finding therefore says which part of the text matched.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from clawmem import events
from clawmem.errors import GuardBlocked
from clawmem.prompt import USER_MESSAGE, GuardFinding, Span
from clawmem.recall import AugmentResult
from clawmem.settings import PII_GUARD_MODES

_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}(?![A-Za-z])")
# 13-19 digits, optionally split by single spaces or dashes; the whole digit run must qualify.
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
# Area 000, 666 and 9xx, group 00 and serial 0000 are never issued.
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])")
# North American numbers need separators, so bare 10-digit ids and timestamps do not match.
_PHONE_NANP = re.compile(r"(?<![\w+(])(?:\+?1[ .-])?(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}(?!\w)")
_PHONE_INTERNATIONAL = re.compile(r"(?<![\w+])\+\d[\d .()-]{6,20}\d(?!\w)")


def luhn_valid(digits: str) -> bool:
    """Return whether the digit string passes the Luhn checksum card numbers carry."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        number = int(char)
        if position % 2 == 1:
            number = number * 2 - 9 if number > 4 else number * 2
        total += number
    return total % 10 == 0


def _digits(text: str) -> str:
    return "".join(char for char in text if char.isdigit())


def _card_ok(text: str) -> bool:
    digits = _digits(text)
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _international_ok(text: str) -> bool:
    return 8 <= len(_digits(text)) <= 15


# (pattern name, regex, extra check). Earlier patterns win where matches overlap, so a card
# number is not also reported as a phone number.
PATTERNS: tuple[tuple[str, re.Pattern[str], Callable[[str], bool] | None], ...] = (
    ("email", _EMAIL, None),
    ("card number", _CARD, _card_ok),
    ("SSN", _SSN, None),
    ("phone number", _PHONE_NANP, None),
    ("phone number", _PHONE_INTERNATIONAL, _international_ok),
)


# What a redacted match becomes, per pattern.
REDACTIONS = {"email": "[email]", "card number": "[card]", "SSN": "[ssn]", "phone number": "[phone]"}
_MEMORY_KEY = "memory key "


class Guard(Protocol):
    """A check over the augmented text of a turn, before it leaves the host.

    ``apply`` returns the text to send (the same result, or one with matches redacted) with its
    findings added, or raises ``GuardBlocked`` to stop the turn.
    """

    def apply(self, augmented: AugmentResult) -> AugmentResult: ...


@runtime_checkable
class RedactingGuard(Guard, Protocol):
    """A guard that redacts, and so also redacts what earlier turns stored as said before a
    turn sends them again (:class:`PiiGuard` is one)."""

    def redact_history(self, history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class _Match:
    start: int
    end: int
    finding: GuardFinding


def _matches(text: str, spans: Sequence[Span] = ()) -> list[_Match]:
    """Return every non-overlapping match in ``text`` in order, each attributed to the span that
    contains its start (text outside every span counts as the user message)."""
    claimed: list[tuple[int, int]] = []
    found: list[_Match] = []
    for name, regex, accept in PATTERNS:
        for match in regex.finditer(text):
            start, end = match.span()
            if accept is not None and not accept(match.group()):
                continue
            if any(start < taken_end and taken_start < end for taken_start, taken_end in claimed):
                continue
            claimed.append((start, end))
            source = next((span.source for span in spans if span.start <= start < span.end), USER_MESSAGE)
            found.append(_Match(start, end, GuardFinding(name, source)))
    return sorted(found, key=lambda match: match.start)


def _distinct(matches: Sequence[_Match]) -> list[GuardFinding]:
    findings: list[GuardFinding] = []
    for match in matches:
        if match.finding not in findings:
            findings.append(match.finding)
    return findings


def scan(text: str, spans: Sequence[Span] = ()) -> list[GuardFinding]:
    """Return the distinct (pattern, source) findings in ``text``, in order of first match.

    A match is attributed to the span that contains its start; text outside every span (or
    with no spans at all) counts as the user message.
    """
    return _distinct(_matches(text, spans))


def redact(text: str, spans: Sequence[Span], matches: Sequence[_Match]) -> tuple[str, tuple[Span, ...]]:
    """Return ``text`` with each match replaced by its label (``[email]``...) and the spans moved
    to where their text now is."""
    parts: list[str] = []
    edges: list[tuple[int, int, int]] = []  # (old start, old end, new end) of each match
    cursor = written = 0
    for match in matches:
        label = REDACTIONS[match.finding.pattern]
        parts.extend([text[cursor : match.start], label])
        written += match.start - cursor + len(label)
        edges.append((match.start, match.end, written))
        cursor = match.end
    parts.append(text[cursor:])

    def moved(position: int) -> int:
        shift = 0
        for start, end, new_end in edges:
            if position >= end:
                shift = new_end - end
            elif position > start:
                return new_end  # inside a match: the end of its label
            else:
                break
        return position + shift

    return "".join(parts), tuple(Span(moved(span.start), moved(span.end), span.source) for span in spans)


def _redacted(value: Any) -> Any:
    """Return ``value`` with every match in its strings (nested in lists and dicts) replaced by its label."""
    if isinstance(value, str):
        return redact(value, (), _matches(value))[0]
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    return value


class PiiGuard:
    """Detects email addresses, card numbers (Luhn-checked), US SSNs and phone numbers in the
    augmented text of a turn.

    ``mode`` says what a finding does: ``block`` stops the turn (``GuardBlocked``), ``redact``
    replaces each match with ``[email]``, ``[card]``, ``[ssn]`` or ``[phone]`` before the text
    leaves the host, ``warn`` only reports, and ``off`` does not scan. Matches in the line of a
    memory key listed in ``allow_keys`` (operator-curated contact details) are ignored.
    """

    name = "pii"

    def __init__(self, mode: str = "block", allow_keys: Iterable[str] = ()) -> None:
        if mode not in PII_GUARD_MODES:
            raise ValueError(f"PII guard mode must be one of {', '.join(PII_GUARD_MODES)}, got {mode!r}")
        self.mode = mode
        self.allow_keys = frozenset(allow_keys)

    def __repr__(self) -> str:
        return f"PiiGuard(mode={self.mode!r}, allow_keys={sorted(self.allow_keys)!r})"

    def _matches(self, augmented: AugmentResult | str) -> list[_Match]:
        if isinstance(augmented, AugmentResult):
            found = _matches(augmented.text, augmented.spans)
        elif isinstance(augmented, str):
            found = _matches(augmented)
        else:
            raise TypeError(f"expected an AugmentResult or str, got {type(augmented).__name__}")
        allowed = {_MEMORY_KEY + key for key in self.allow_keys}
        return [match for match in found if match.finding.source not in allowed]

    def find(self, augmented: AugmentResult | str) -> list[GuardFinding]:
        """Return every finding the mode would act on (allowed keys left out); never raises.
        ``off`` finds nothing."""
        return [] if self.mode == "off" else _distinct(self._matches(augmented))

    def check(self, augmented: AugmentResult | str) -> list[GuardFinding]:
        """Return the findings; in ``block`` mode raise :class:`GuardBlocked` when there are any."""
        findings = self.find(augmented)
        if findings and self.mode == "block":
            self._block(findings)
        return findings

    def _block(self, findings: list[GuardFinding]) -> None:
        events.emit(
            "guard.blocked",
            guard=self.name,
            findings=[{"pattern": finding.pattern, "source": finding.source} for finding in findings],
        )
        described = "; ".join(f"{finding.pattern} found in {finding.source}" for finding in findings)
        raise GuardBlocked(f"PII guard blocked the turn: {described}", tuple(findings))

    def redact_text(self, text: str) -> str:
        """Return ``text`` with every match the guard finds replaced by its label (``[email]``...),
        whatever the mode (the caller decides when a redaction applies)."""
        return redact(text, (), _matches(text))[0]

    def redact_history(self, history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Return the earlier messages of a turn as they may leave the host: in ``redact`` mode
        with every match in each message's content and tool input replaced by its label (the
        stored conversation holds the original text, so it would otherwise be sent again on the
        next turn and to a summariser); in any other mode unchanged."""
        if self.mode != "redact":
            return [dict(message) for message in history]
        return [
            {
                name: _redacted(value) if name in ("content", "tool_input") else value
                for name, value in message.items()
            }
            for message in history
        ]

    def apply(self, augmented: AugmentResult) -> AugmentResult:
        """Return the result to send, its ``findings`` extended; redacted in ``redact`` mode.

        Raises :class:`clawmem.errors.GuardBlocked` in ``block`` mode when anything is found,
        after emitting ``guard.blocked``; the message names each pattern and its source, never
        the text.
        """
        if self.mode == "off":
            return augmented
        matches = self._matches(augmented)
        findings = _distinct(matches)
        if not findings:
            return augmented
        if self.mode == "block":
            self._block(findings)
        found = (*augmented.findings, *findings)
        if self.mode == "warn":
            return dataclasses.replace(augmented, findings=found)
        text, spans = redact(augmented.text, augmented.spans, matches)
        return dataclasses.replace(augmented, text=text, spans=spans, findings=found)
