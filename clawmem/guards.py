"""Guards that scan the augmented text of a turn before it reaches the provider.

Because the scan covers the augmented text, a recalled memory entry can block a turn whose
user message is clean; each finding therefore says which part of the text matched.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

from clawmem import events
from clawmem.errors import GuardBlocked
from clawmem.prompt import USER_MESSAGE, GuardFinding, Span
from clawmem.recall import AugmentResult

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


class Guard(Protocol):
    """A check over the augmented text: returns findings, raises ``GuardBlocked`` to stop the turn."""

    def check(self, augmented: AugmentResult | str) -> list[GuardFinding]: ...


def scan(text: str, spans: tuple[Span, ...] | list[Span] = ()) -> list[GuardFinding]:
    """Return the distinct (pattern, source) findings in ``text``, in order of first match.

    A match is attributed to the span that contains its start; text outside every span (or
    with no spans at all) counts as the user message.
    """
    claimed: list[tuple[int, int]] = []
    located: list[tuple[int, GuardFinding]] = []
    for name, regex, accept in PATTERNS:
        for match in regex.finditer(text):
            start, end = match.span()
            if accept is not None and not accept(match.group()):
                continue
            if any(start < taken_end and taken_start < end for taken_start, taken_end in claimed):
                continue
            claimed.append((start, end))
            source = next((span.source for span in spans if span.start <= start < span.end), USER_MESSAGE)
            located.append((start, GuardFinding(name, source)))
    findings: list[GuardFinding] = []
    for _, finding in sorted(located, key=lambda item: item[0]):
        if finding not in findings:
            findings.append(finding)
    return findings


class PiiGuard:
    """Detects email addresses, card numbers (Luhn-checked), US SSNs and phone numbers.

    With ``block=True`` :meth:`check` raises :class:`clawmem.errors.GuardBlocked`; with
    ``block=False`` it only returns the findings.
    """

    name = "pii"

    def __init__(self, block: bool = True) -> None:
        self.block = block

    def __repr__(self) -> str:
        return f"PiiGuard(block={self.block!r})"

    def find(self, augmented: AugmentResult | str) -> list[GuardFinding]:
        """Return every finding in the augmented text (or plain user text); never raises."""
        if isinstance(augmented, AugmentResult):
            return scan(augmented.text, augmented.spans)
        if not isinstance(augmented, str):
            raise TypeError(f"expected an AugmentResult or str, got {type(augmented).__name__}")
        return scan(augmented)

    def check(self, augmented: AugmentResult | str) -> list[GuardFinding]:
        """Return the findings; when blocking and any exist, emit ``guard.blocked`` and raise
        :class:`clawmem.errors.GuardBlocked` naming each pattern and its source."""
        findings = self.find(augmented)
        if findings and self.block:
            events.emit(
                "guard.blocked",
                guard=self.name,
                findings=[{"pattern": finding.pattern, "source": finding.source} for finding in findings],
            )
            described = "; ".join(f"{finding.pattern} found in {finding.source}" for finding in findings)
            raise GuardBlocked(f"PII guard blocked the turn: {described}", tuple(findings))
        return findings
