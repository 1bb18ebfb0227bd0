"""Recall: what memory reaches the model each turn (SPEC 5), all of it in this package.

- :mod:`~clawmem.recall.words`: the one tokeniser (and its stemming, ``CLAW_RECALL_STEMMING``)
  and the word-overlap score's definition;
- :mod:`~clawmem.recall.index`: the word index a turn is answered from, packed by
  :mod:`~clawmem.recall.keys` and :mod:`~clawmem.recall.postings`;
- :mod:`~clawmem.recall.feeds`: the indexes kept fresh by the drivers' change feeds;
- :mod:`~clawmem.recall.candidates`: what every ranking answers;
  :mod:`~clawmem.recall.rankings`: the reference scan and the index ranking;
  :mod:`~clawmem.recall.phpclaw`: phpClaw's own scoring;
- :mod:`~clawmem.recall.scoring` and :mod:`~clawmem.recall.weighted_index`: ``weighted``;
  :mod:`~clawmem.recall.fusion`: ``semantic`` and ``hybrid``, over
  :mod:`~clawmem.recall.embeddings` and the vectors :mod:`~clawmem.recall.persisted` keeps;
- :mod:`~clawmem.recall.injection`: the injected block's format and budget;
- :mod:`~clawmem.recall.report`: every candidate's decision (:class:`AugmentResult`);
- :mod:`~clawmem.recall.augmenter`: :class:`MessageAugmenter`, one turn;
- :mod:`~clawmem.recall.survey` and :mod:`~clawmem.recall.compare`: what the dashboard's
  preview, its comparison of two scorings and the cold-memory page show;
- :mod:`~clawmem.recall.eval`: recall quality on a labelled file (``clawmem eval``);
- :mod:`~clawmem.recall.sources`: the protocols recall reads memory through.
"""

from __future__ import annotations

from clawmem.recall.augmenter import MessageAugmenter
from clawmem.recall.injection import DEFAULT_MAX_RECALL_BYTES, MEMORY_HEADER, USER_HEADER, plan
from clawmem.recall.report import AugmentResult, EntryDecision
from clawmem.recall.survey import injection_counts
from clawmem.recall.words import keywords

__all__ = [
    "DEFAULT_MAX_RECALL_BYTES",
    "MEMORY_HEADER",
    "USER_HEADER",
    "AugmentResult",
    "EntryDecision",
    "MessageAugmenter",
    "injection_counts",
    "keywords",
    "plan",
]
