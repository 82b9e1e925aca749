"""The synthetic embedder (`embed.backend: synthetic`): a seeded unit vector per text near
one of TOPICS centroids, as cheap as a hash. The benchmarks' generated stores name it in
their manifests, so `tkg search`, `tkg serve` and `tkg.query.open` query them with the
vectors they were generated with and time retrieval, not a model. `embed.model` is
`synthetic-<dim>d-seed<seed>` (`model_name`): the width and the seed of the centroids."""

from __future__ import annotations

import re
import zlib

import numpy as np
from tkg.pipeline.config import EmbedConfig

TOPICS = 512
MODEL = re.compile(r"synthetic-(\d+)d-seed(\d+)")


def centroids(dim: int, seed: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Topic centroids: the first draw of a store's generator, so its query embedder can be
    rebuilt from the seed alone."""
    rng = rng or np.random.default_rng(seed)
    drawn = rng.standard_normal((TOPICS, dim), dtype=np.float32)
    return drawn / np.linalg.norm(drawn, axis=1, keepdims=True)


def model_name(dim: int, seed: int) -> str:
    return f"synthetic-{dim}d-seed{seed}"


class SyntheticEmbedder:
    """A seeded unit vector per text near one of the topic centroids."""

    def __init__(self, topic_centroids: np.ndarray) -> None:
        self.centroids = topic_centroids
        self.dim = topic_centroids.shape[1]

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            rng = np.random.default_rng(zlib.crc32(text.encode()))
            v = self.centroids[rng.integers(len(self.centroids))] + 0.3 * rng.standard_normal(
                self.dim, dtype=np.float32) / np.sqrt(self.dim)
            out[i] = v / np.linalg.norm(v)
        return out


def synthetic_embedder(config: EmbedConfig) -> SyntheticEmbedder:
    """The registry's factory: width and seed from `embed.model` (see `model_name`)."""
    found = MODEL.fullmatch(config.model)
    if found is None:
        raise ValueError(f"embed.model {config.model!r} is not a synthetic model name "
                         "(synthetic-<dim>d-seed<seed>)")
    return SyntheticEmbedder(centroids(int(found[1]), int(found[2])))
