"""The embedder's width read from the model folder equals the loaded model's; the bfloat16
encoder stays near float32's vectors and gives a text the same vector in any batch."""

import numpy as np
from tkg.pipeline.config import EmbedConfig, TkgConfig
from tkg.pipeline.embed import SentenceTransformerEmbedder, embedding_dim, numpy_embedder

from tests.test_minilm_numpy import real_sentences


def test_width_from_the_model_folder_matches_the_loaded_model():
    config = TkgConfig()
    assert SentenceTransformerEmbedder.config_dim(config.embed) == 384
    assert embedding_dim(config) == SentenceTransformerEmbedder(config.embed).dim


def test_bfloat16_vectors_are_near_float32_and_the_same_in_any_batch():
    """Within 3e-3 of float32's (cosine above 0.9999), unit length; and bit for bit the same
    whether a text is embedded alone, in a column or among others (the driver embeds a
    column at once, an actor 1,024 rows: both paths must publish the same vectors)."""
    config = EmbedConfig(precision="bfloat16")
    texts = [*real_sentences(), "Caroline", "Melanie Smith", "Ana lives in Lisbon", "x"]
    bf16, float32 = numpy_embedder(config, bfloat16=True), numpy_embedder(config)
    together = bf16.embed(texts)
    exact = float32.embed(texts)
    assert together.shape == exact.shape and together.dtype == np.float32
    assert np.abs(together - exact).max() < 3e-3
    assert np.sum(together * exact, axis=1).min() > 0.9999
    assert np.allclose(np.linalg.norm(together, axis=1), 1, atol=1e-5)
    alone = np.concatenate([bf16.embed([text]) for text in texts])
    shuffled = bf16.embed(texts[::-1] + texts[:3])[:len(texts)][::-1]
    assert np.array_equal(together, alone) and np.array_equal(together, shuffled)
