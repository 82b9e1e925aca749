"""The embedder's width read from the model folder equals the loaded model's."""

from tkg.pipeline.config import TkgConfig
from tkg.pipeline.embed import SentenceTransformerEmbedder, embedding_dim


def test_width_from_the_model_folder_matches_the_loaded_model():
    config = TkgConfig()
    assert SentenceTransformerEmbedder.config_dim(config.embed) == 384
    assert embedding_dim(config) == SentenceTransformerEmbedder(config.embed).dim
