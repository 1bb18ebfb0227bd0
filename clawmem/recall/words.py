"""Words: the one tokeniser, and the one definition of how many words an entry shares.

A word is a maximal run of Unicode letters and digits, casefolded; a single ``'``, ``’`` or
``-`` between two runs joins them (``don't``, ``well-known``). Words have at least three
characters. An entry's score is how many distinct query words occur among the words of
``key + " " + text(value)`` (:func:`entry_words`); the scan (:class:`~clawmem.recall.rankings.ScanRanking`)
and the index (:class:`~clawmem.recall.index.WordIndex`) both score with these words.

With ``CLAW_RECALL_STEMMING=english`` each word is replaced by its Snowball English stem
(``shipped`` and ``shipping`` are both ``ship``) after the three-character rule, in the query and
in the entry alike; :func:`keywords` and :func:`entry_words` are the one place that happens, and
every scoring but ``phpclaw`` (which has its own word rule) takes its words from them.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from clawmem.settings import NO_STEMMING, RECALL_STEMMINGS

MIN_WORD_CHARS = 3
DEFAULT_TOP_K = 3

# The words a question is built with rather than what it asks about: its interrogative, the
# auxiliaries that carry it ("What did Ann buy?") and the commonest English function words. A
# stored fact rarely holds the first, so their rarity made them weigh most in ``weighted``
# wherever one turned up; the others only add noise. ``weighted`` scores a message without them.
# Chosen on LoCoMo's dev split by leave-one-conversation-out (python -m bench.tune): dropping
# none gave 0.656 recall@3, the interrogatives and auxiliaries alone 0.687, this list 0.679 (each
# fold chose it), a longer one 0.676 (flat); with ``hybrid`` 0.725, 0.733, 0.735 and 0.738.
_QUESTION_WORDS = (
    "what when where who whom whose which why how did does was were are has have had"
    " the and for with that this those these her his him she they them their you your our its"
    " from about any some would could should might can will shall into onto than then there here"
    " also such very much many more most other"
)
QUESTION_WORDS = frozenset(_QUESTION_WORDS.split())

# A word is a maximal run of Unicode letters and digits; a single ' ’ or - between two such
# runs joins them into one word ("don't", "well-known").
_LETTER_OR_DIGIT = r"[^\W_]"
_WORD = re.compile(rf"{_LETTER_OR_DIGIT}+(?:['’\-]{_LETTER_OR_DIGIT}+)*")


_STEMMERS = threading.local()  # a Snowball stemmer is not safe to share between threads


def check_stemming(stemming: str) -> str:
    """Return ``stemming`` when it is one of :data:`RECALL_STEMMINGS`; raise
    ``ValueError`` naming the allowed values otherwise."""
    if stemming not in RECALL_STEMMINGS:
        raise ValueError(f"stemming must be one of {', '.join(RECALL_STEMMINGS)}, got {stemming!r}")
    return stemming


def _stem_many(stemming: str) -> Callable[[list[str]], list[str]] | None:
    """Return the function that stems a list of words under ``stemming`` (this thread's own
    Snowball stemmer), or ``None`` for ``off``."""
    if check_stemming(stemming) == NO_STEMMING:
        return None
    stem = getattr(_STEMMERS, stemming, None)
    if stem is None:
        import Stemmer  # PyStemmer: Snowball compiled to C, imported only when words are stemmed

        # No cache: PyStemmer's own slows a large vocabulary's stemming several times.
        stem = Stemmer.Stemmer(stemming, 0).stemWords
        setattr(_STEMMERS, stemming, stem)
    return stem


def _words(text: str) -> list[str]:
    """Return every casefolded word of ``text`` with 3+ characters, repeats included, in order."""
    return [word for word in _WORD.findall(text.casefold()) if len(word) >= MIN_WORD_CHARS]


def keywords(text: str, stemming: str = NO_STEMMING) -> list[str]:
    """Return the distinct casefolded words of ``text`` with 3+ characters, first-seen order;
    with ``stemming``, their distinct stems."""
    words = _words(text)
    stem = _stem_many(stemming)
    return list(dict.fromkeys(words if stem is None else stem(words)))


def asked_words(text: str, stemming: str = NO_STEMMING) -> list[str]:
    """Return :func:`keywords` of ``text`` less :data:`QUESTION_WORDS` (taken as written, before
    stemming): the words ``weighted`` scores a message by."""
    words = [word for word in _words(text) if word not in QUESTION_WORDS]
    stem = _stem_many(stemming)
    return list(dict.fromkeys(words if stem is None else stem(words)))


def stems_of(text: str, stemming: str) -> dict[str, tuple[str, ...]]:
    """Return each stem of :func:`keywords` of ``text`` with the words of ``text`` it stands for
    (first-seen order): what the preview shows as ``shipped → ship``. Without stemming, each
    word stands for itself."""
    words = list(dict.fromkeys(_words(text)))
    stem = _stem_many(stemming)
    found: dict[str, dict[str, None]] = {}
    for word, stemmed in zip(words, words if stem is None else stem(words), strict=True):
        found.setdefault(stemmed, {})[word] = None
    return {stemmed: tuple(sources) for stemmed, sources in found.items()}


def shown_matches(matched: Iterable[str], stems: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Return the ``matched`` words as a report shows them: a stem the message wrote otherwise
    as ``shipped → ship`` (``stems`` is :func:`stems_of` of the message), any other word as is."""
    shown = []
    for word in matched:
        sources = [source for source in stems.get(word, ()) if source != word]
        shown.append(f"{', '.join(sources)} → {word}" if sources else word)
    return tuple(shown)


def whole_token_pattern(text: str) -> re.Pattern[str]:
    """Return the regex of ``text`` standing as a whole token: no letter or digit (as words
    count them) right before or after it."""
    return re.compile(rf"(?<!{_LETTER_OR_DIGIT}){re.escape(text)}(?!{_LETTER_OR_DIGIT})")


def text_of(value: Any) -> str:
    """Return the text recall scores and injects: a str as is, anything else as sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def entry_words(key: str, text: str, stemming: str = NO_STEMMING) -> set[str]:
    """Return the distinct words (with ``stemming``, stems) of an entry whose value text is
    ``text``: what a query word of :func:`keywords` under the same stemming must be one of to
    count."""
    words = _words(f"{key} {text}")
    stem = _stem_many(stemming)
    return set(words if stem is None else stem(words))


def shared_words(query_words: Iterable[str], key: str, text: str) -> list[str]:
    """Return the query words (in their order) that occur among the entry's words."""
    held = entry_words(key, text)
    return [word for word in query_words if word in held]


def score(query_words: Iterable[str], key: str, value: Any) -> int:
    """Return how many distinct query words occur among the words of the entry ``(key, value)``."""
    return len(set(shared_words(set(query_words), key, text_of(value))))
