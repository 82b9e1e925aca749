"""A BERT sentence encoder in numpy: the same vectors as sentence-transformers for a model
folder laid out as Transformer (BERT) + Pooling (+ Normalize), without importing torch,
transformers or sentence-transformers.

Those imports cost a cold `tkg search` ~4 s of its ~6 s (sentence_transformers 2.9 s,
torch 0.9 s on the 2-core dev machine); this module imports `tokenizers`, `safetensors`
and numpy only. The forward pass is float32 throughout: it agrees with sentence-transformers
in float32 to ~1e-6 (tests/test_minilm_numpy.py) and with its bfloat16 autocast to ~1e-3.

`Bf16BertEncoder` is the same model with its matrix products in bfloat16 on torch, for
builds on CPUs where bf16 is the faster (`embed.precision`); queries keep the float32 encoder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

# erf by Abramowitz & Stegun 7.1.26 (max error 1.5e-7, below float32's resolution of
# gelu's output): numpy has no erf, and scipy.special alone costs ~0.35 s to import.
_ERF_P = np.float32(0.3275911)
_ERF_A = tuple(np.float32(a) for a in
               (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))


def _gelu(x: np.ndarray, bias: np.ndarray, rows: int = 64) -> np.ndarray:
    """BERT's exact gelu of x + bias, x (1 + erf(x / sqrt 2)) / 2, in place, in blocks of
    `rows` rows whose ~20 passes stay in cache (a 1,024 x 1,536 batch: 4.5 ms in blocks of 64
    rows, 11.4 ms at once; gelu had been 40% of the encoder's time). The bias is added block
    by block for the same reason: the same sums as adding it to x first."""
    for start in range(0, x.shape[0], rows):
        block = x[start:start + rows]
        block += bias
        _gelu_block(block)
    return x


def _gelu_block(x: np.ndarray) -> None:
    """x (1 + erf(x / sqrt 2)) / 2 = (x + |x| - |x| tail) / 2 with tail = 1 - erf(|x| /
    sqrt 2) = poly(t) exp(-x^2 / 2), t = 1 / (1 + p |x| / sqrt 2)."""
    magnitude = np.abs(x)
    t = magnitude * (_ERF_P * np.float32(0.7071067811865476))
    t += 1.0
    np.reciprocal(t, out=t)
    tail = t * _ERF_A[0]
    for a in _ERF_A[1:]:
        tail += a
        tail *= t
    np.multiply(magnitude, np.float32(-0.5), out=t)
    t *= magnitude
    np.exp(t, out=t)
    tail *= t
    tail *= magnitude
    x += magnitude
    x -= tail
    x *= np.float32(0.5)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                eps: float) -> np.ndarray:
    """Layer norm of x, in place (x is always a temporary of the caller's): the same
    operations in the same order as out of place, so the same bits, without four new
    arrays a call."""
    mean = x.mean(axis=-1, keepdims=True)
    x -= mean
    var = np.mean(x * x, axis=-1, keepdims=True)
    x /= np.sqrt(var + np.float32(eps))
    x *= weight
    x += bias
    return x

# Tokens per batch (texts x the longest's length): on 1 thread the demo's 812 texts took
# 4.0 s at 1,024 tokens, 4.4 s at 512, 4.6 s at 2,048, 6.0 s at 8,192, and 11.9 s in
# batches of 128 texts, whose attention scores (128 x 12 x 128 x 128) fall out of cache.
BATCH_TOKENS = 1024


@dataclass(frozen=True)
class _Layer:
    qkv: np.ndarray  # (hidden, 3 * hidden): query, key and value in one matmul
    qkv_bias: np.ndarray
    attn_out: np.ndarray
    attn_out_bias: np.ndarray
    attn_norm: tuple[np.ndarray, np.ndarray]
    inter: np.ndarray
    inter_bias: np.ndarray
    out: np.ndarray
    out_bias: np.ndarray
    out_norm: tuple[np.ndarray, np.ndarray]


def supports(folder: Path, transformer_dir: str) -> bool:
    """A BERT encoder with the files this module reads (tokenizer.json, model.safetensors)
    and the activation it implements."""
    root = folder / transformer_dir
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (config.get("model_type") == "bert"
            and config.get("hidden_act", "gelu") == "gelu"
            and config.get("position_embedding_type", "absolute") == "absolute"
            and (root / "tokenizer.json").is_file()
            and (root / "model.safetensors").is_file())


class NumpyBertEncoder:
    """Texts -> pooled sentence vectors, float32 (the `Embedder` protocol)."""

    def __init__(self, root: Path, max_seq_length: int, pooling: str, normalize: bool,
                 batch_size: int = 128, threads: int = 1) -> None:
        from safetensors.numpy import load_file
        from threadpoolctl import ThreadpoolController
        from tokenizers import Tokenizer

        config = json.loads((root / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.pooling = pooling
        self.normalize = normalize
        self.batch_size = max(batch_size, 1)
        # BLAS threads as torch's set_num_threads in the torch embedder: OpenBLAS's default
        # (all cores) spun 0.2 s of CPU per one-sentence query on the shared 2-core machine
        # against 0.014 s on one thread, and 43 s against 3 s for 256 texts.
        self.threads = max(threads, 1)
        self._blas = ThreadpoolController()
        # Runs calls at once on several threads (the query's `tkg.query.search.together`):
        # each dense product then computes halves of its columns at once (`_dense`).
        self.together: Callable[[list[Callable[[], np.ndarray]]], list[np.ndarray]] | None = None
        limit = min(max_seq_length, int(config.get("max_position_embeddings", 512)))
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        # The file's own settings (fixed padding to 128) are replaced by the model's limit;
        # `embed` pads each batch to its longest text, as sentence-transformers does.
        self.tokenizer.enable_truncation(max_length=limit)
        self.tokenizer.no_padding()
        self.pad_id = int(config.get("pad_token_id", 0))
        self._load(load_file(str(root / "model.safetensors")), int(config["num_hidden_layers"]))
        self.dim = int(self.word.shape[1])

    def _load(self, tensors: dict[str, np.ndarray], layers: int) -> None:
        marker = "embeddings.word_embeddings.weight"
        prefix = next(key[: -len(marker)] for key in tensors if key.endswith(marker))

        def get(name: str) -> np.ndarray:
            return np.ascontiguousarray(tensors[prefix + name], dtype=np.float32)

        def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
            return get(f"{name}.LayerNorm.weight"), get(f"{name}.LayerNorm.bias")

        self.word = get("embeddings.word_embeddings.weight")
        self.position = get("embeddings.position_embeddings.weight")
        self.token_type = get("embeddings.token_type_embeddings.weight")
        self.embed_norm = norm("embeddings")
        self.layers = []
        for i in range(layers):
            base = f"encoder.layer.{i}."
            attention = base + "attention.self."
            self.layers.append(_Layer(
                qkv=np.ascontiguousarray(np.concatenate(
                    [get(f"{attention}{p}.weight") for p in ("query", "key", "value")]).T),
                qkv_bias=np.concatenate(
                    [get(f"{attention}{p}.bias") for p in ("query", "key", "value")]),
                attn_out=np.ascontiguousarray(get(base + "attention.output.dense.weight").T),
                attn_out_bias=get(base + "attention.output.dense.bias"),
                attn_norm=norm(base + "attention.output"),
                inter=np.ascontiguousarray(get(base + "intermediate.dense.weight").T),
                inter_bias=get(base + "intermediate.dense.bias"),
                out=np.ascontiguousarray(get(base + "output.dense.weight").T),
                out_bias=get(base + "output.dense.bias"),
                out_norm=norm(base + "output"),
            ))

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32. Texts are tokenized once, sorted by length and cut
        into batches of about `BATCH_TOKENS` tokens (with padding), so that little padding
        is computed and a batch's arrays stay in cache."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        encodings = self.tokenizer.encode_batch([text.strip() for text in texts])
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        with self._blas.limit(limits=self.threads, user_api="blas"):
            start = 0
            while start < len(order):
                longest = max(len(encodings[order[start]].ids), 1)
                size = min(self.batch_size, max(BATCH_TOKENS // longest, 1))
                rows = order[start:start + size]
                out[rows] = self._encode_batch([encodings[i].ids for i in rows], longest)
                start += size
        return out

    def _encode_batch(self, token_ids: list[list[int]], length: int) -> np.ndarray:
        ids = np.full((len(token_ids), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(token_ids), length), dtype=np.float32)
        for row, tokens in enumerate(token_ids):
            ids[row, :len(tokens)] = tokens
            mask[row, :len(tokens)] = 1.0
        hidden = self._forward(ids, mask)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask[:, :, None]
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32, copy=False)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch, length = ids.shape
        x = self.word[ids] + self.position[:length] + self.token_type[0]
        # Activations stay (batch * length, hidden): one GEMM per projection, where a 3-d
        # operand makes numpy loop over the batch (~10x slower on 256 texts).
        x = _layer_norm(x.reshape(batch * length, -1), *self.embed_norm, self.eps)
        # Padding keys get a large negative score: their softmax weight underflows to 0.
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for layer in self.layers:
            x = self._layer(x, bias, layer, batch, length)
        return x.reshape(batch, length, -1)

    def _layer(self, x: np.ndarray, bias: np.ndarray, layer: _Layer, batch: int,
               length: int) -> np.ndarray:
        hidden = x.shape[-1]
        head = hidden // self.heads
        # Biases and residuals are added in place (`+=`: the sums of `a @ w + b + x`, in
        # the same order, so the same bits): 1,500 bench texts on one thread 7.57 -> 7.22 s.
        qkv = self._dense(x, layer.qkv, layer.qkv_bias).reshape(batch, length, 3, self.heads,
                                                                head)
        # Contiguous (batch, heads, ...) operands: numpy hands strided ones to a loop that
        # does not use BLAS.
        q = np.ascontiguousarray(qkv[:, :, 0].transpose(0, 2, 1, 3))
        k = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1))
        v = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3))
        scores = q @ k
        scores *= np.float32(1.0 / np.sqrt(head))
        scores += bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, hidden)
        attended = self._dense(context, layer.attn_out, layer.attn_out_bias)
        attended += x
        x = _layer_norm(attended, *layer.attn_norm, self.eps)
        out = self._dense(self._dense(x, layer.inter, layer.inter_bias, gelu=True), layer.out,
                          layer.out_bias)
        out += x
        return _layer_norm(out, *layer.out_norm, self.eps)

    def _dense(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray,
               gelu: bool = False) -> np.ndarray:
        """x @ weight + bias (then gelu); with `together` set, the two halves of its columns
        at once on two threads, each on one BLAS thread. The same bits: each output is the
        same sum over the same inputs, whichever columns share its product
        (`tests/test_query_embedding.py`). A question pair (~28 tokens) on the 2-core
        machine: 14.0 -> 10.8 ms (p50 of 300 LoCoMo pairs, load 2.4-2.8), where each text
        on a thread of its own took 12.6 ms (each thread reads all the weights)."""
        def columns(part: slice) -> np.ndarray:
            y = x @ weight[:, part]
            if gelu:
                return _gelu(y, bias[part])
            y += bias[part]
            return y

        if self.together is None:
            return columns(slice(None))
        half = weight.shape[1] // 2
        return np.concatenate(self.together([partial(columns, slice(None, half)),
                                             partial(columns, slice(half, None))]), axis=1)


# Tokens per bfloat16 batch: 400 episode texts took 1.50 s at 1,024 tokens and 1.44 s at
# 4,096 on one thread (640 facts 1.43 and 1.36 s); numpy's float32 encoder 2.8-3.4 s.
BF16_BATCH_TOKENS = 4096


class Bf16BertEncoder(NumpyBertEncoder):
    """The encoder with its matrix products in bfloat16 on torch (oneDNN's AVX512-BF16
    kernels; sums in float32), layer norms and the residual stream in float32. On the 2-core
    AMD EPYC (AVX512-BF16), one thread: 400 episode texts 1.44 s against numpy's 2.79 s,
    640 fact texts 1.36 against 3.02 s; vectors within 2.1e-3 of float32's (cosine above
    0.99997).

    A build's texts are batched only with texts of the same token length, with no padding:
    a text's vector is then the same bits whatever else is embedded with it (the driver
    embeds a column at once, an actor 1,024 rows). Padded bfloat16 batches moved a text's
    vector by up to 1.3e-3 between two batchings, past the 1e-3 at which tests/paths.py
    holds the execution paths equal, and past forget's 1e-5. A question is embedded with
    `padded` (`tkg.query.embedding`): its one or two texts in one padded batch, the same
    bits for the same question every time."""

    padded = False  # all texts of a call in one padded batch (a question's few texts)

    def __init__(self, root: Path, max_seq_length: int, pooling: str, normalize: bool,
                 batch_size: int = 128, threads: int = 1) -> None:
        import torch

        super().__init__(root, max_seq_length, pooling, normalize, batch_size, threads)
        torch.set_num_threads(self.threads)
        self._torch = torch

        def weights(array: np.ndarray) -> torch.Tensor:  # (out, in) for F.linear
            return torch.from_numpy(np.ascontiguousarray(array.T)).to(torch.bfloat16)

        def bias(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).to(torch.bfloat16)

        def norm(pair: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.from_numpy(pair[0]), torch.from_numpy(pair[1])

        self._embeddings = (torch.from_numpy(self.word), torch.from_numpy(self.position),
                            torch.from_numpy(self.token_type[0]), norm(self.embed_norm))
        self._bf16_layers = [
            (weights(layer.qkv), bias(layer.qkv_bias), weights(layer.attn_out),
             bias(layer.attn_out_bias), norm(layer.attn_norm), weights(layer.inter),
             bias(layer.inter_bias), weights(layer.out), bias(layer.out_bias),
             norm(layer.out_norm))
            for layer in self.layers]

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32: the texts of each token length in batches of up to
        `BF16_BATCH_TOKENS` tokens (and `batch_size` texts); with `padded`, all at once."""
        encodings = self.tokenizer.encode_batch([text.strip() for text in texts])
        if self.padded and texts:
            with self._torch.inference_mode():
                return self._encode_padded([encoding.ids for encoding in encodings])
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        by_length: dict[int, list[int]] = {}
        for row, encoding in enumerate(encodings):
            by_length.setdefault(len(encoding.ids), []).append(row)
        with self._torch.inference_mode():
            for length, rows in by_length.items():
                size = min(self.batch_size, max(BF16_BATCH_TOKENS // max(length, 1), 1))
                for start in range(0, len(rows), size):
                    batch = rows[start:start + size]
                    out[batch] = self._encode_equal([encodings[i].ids for i in batch])
        return out

    def _encode_equal(self, token_ids: list[list[int]]) -> np.ndarray:
        """Pooled vectors of texts of one token length (no padding, no mask)."""
        ids = self._torch.tensor(token_ids, dtype=self._torch.long)
        x = self._encode(ids, None)
        pooled = x[:, 0] if self.pooling == "cls" else x.mean(dim=1)
        return self._pooled(pooled)

    def _encode_padded(self, token_ids: list[list[int]]) -> np.ndarray:
        """Pooled vectors of texts of any lengths in one batch, padded, padding masked."""
        torch = self._torch
        length = max(max(len(ids) for ids in token_ids), 1)
        ids = torch.full((len(token_ids), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(token_ids), length), dtype=torch.bool)
        for row, tokens in enumerate(token_ids):
            ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, :len(tokens)] = True
        x = self._encode(ids, mask[:, None, None, :])
        if self.pooling == "cls":
            return self._pooled(x[:, 0])
        weights = mask[:, :, None].float()
        return self._pooled((x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))

    def _pooled(self, pooled: Any) -> np.ndarray:
        if self.normalize:
            pooled = self._torch.nn.functional.normalize(pooled, dim=1, eps=1e-12)
        return pooled.numpy()

    def _encode(self, ids: Any, mask: Any) -> Any:
        """The last layer's hidden states (batch, length, hidden), float32; `mask`
        (batch, 1, 1, length) True where a key is a token, or None for no padding."""
        torch = self._torch
        functional = torch.nn.functional
        batch, length = ids.shape
        word, position, token_type, embed_norm = self._embeddings
        hidden = word.shape[1]
        x = functional.layer_norm(word[ids] + position[:length] + token_type, (hidden,),
                                  *embed_norm, self.eps)
        for (qkv, qkv_bias, attn_out, attn_out_bias, attn_norm, inter, inter_bias, out,
             out_bias, out_norm) in self._bf16_layers:
            parts = functional.linear(x.to(torch.bfloat16), qkv, qkv_bias).view(
                batch, length, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
            context = functional.scaled_dot_product_attention(parts[0], parts[1], parts[2],
                                                              attn_mask=mask)
            context = context.transpose(1, 2).reshape(batch, length, hidden)
            x = functional.layer_norm(
                functional.linear(context, attn_out, attn_out_bias).float() + x, (hidden,),
                *attn_norm, self.eps)
            inner = functional.gelu(functional.linear(x.to(torch.bfloat16), inter, inter_bias))
            x = functional.layer_norm(functional.linear(inner, out, out_bias).float() + x,
                                      (hidden,), *out_norm, self.eps)
        return x
