"""The query's embedder: the build's encoder, in the snapshot's precision, laid out for a
question's few tokens.

In bfloat16 (`embed.precision: auto` where bf16 is the faster, as for the build's ranked
vectors) a question's one or two texts go through `Bf16BertEncoder` in one padded batch on
one torch thread: a LoCoMo question pair 10.3-10.8 -> 7.4-8.2 ms against the float32 form
below (p50 of 300; two OpenMP threads took 0.8-5 ms a 28-row product on the loaded 2-core
machine, one 0.2 ms), vectors within cosine 0.99998 of float32's.

In float32, a query embeds one or two short texts (the question, and the question without
its speakers' names): 15-40 tokens. The encoder (`tkg.pipeline.minilm_numpy`) computes each
dense layer as `x @ W`, x (tokens, in) and W (in, out). With W in Fortran order, numpy
hands OpenBLAS the transposed operand, which it packs along the rows it reads; the products
are the same sums in the same order (`tests/test_query_embedding.py` holds the vectors
equal, bit for bit, for single questions, pairs and batches). The six layers' dense
products, one thread, on the shared 2-core machine (load 3.4, ms): 16 tokens 13.5 -> 10.5,
32 tokens 17.5 -> 13.5, 64 tokens 22.0 -> 19.4, 1,024 tokens 255 -> 264.

It runs on one BLAS thread whatever `embed.threads_per_actor` the build used: a second
thread on products this small waits more than it works, and on the shared 2-core machine
a question pair took 14-490 ms on two threads (the corpus store's config) against 14-16 ms
on one. Each dense product computes the two halves of its columns at once on two threads
(`NumpyBertEncoder._dense`, `tkg.query.search.together`), each on one BLAS thread: the
same bits, a question pair 14.0 -> 10.8 ms.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from tkg.pipeline.config import EmbedConfig
from tkg.query.search import together

_DENSE = ("qkv", "attn_out", "inter", "out")  # `minilm_numpy._Layer`'s (in, out) weights


def question_embedder(config: EmbedConfig) -> Any:
    """The embedder for questions to a snapshot built with `config`: the build's encoder,
    in bfloat16 where `embed.precision` means it here (`embed.uses_bfloat16`), on one
    thread, laid out for a question (`for_questions`); another backend as configured."""
    from tkg.pipeline.embed import EMBEDDERS, numpy_embedder, uses_bfloat16

    one_thread = config.model_copy(update={"threads_per_actor": 1})
    encoder = numpy_embedder(one_thread, bfloat16=uses_bfloat16(config))
    return for_questions(encoder or EMBEDDERS.build(config.backend, config))


def for_questions(embedder: Any) -> Any:
    """`embedder` laid out for a question's few tokens: the numpy encoder with its dense
    weights in Fortran order and one thread (its vectors unchanged), the bfloat16 encoder
    with a call's texts in one padded batch; any other as it is."""
    from tkg.pipeline.minilm_numpy import Bf16BertEncoder, NumpyBertEncoder

    if type(embedder) is Bf16BertEncoder:
        embedder.padded = True
    if type(embedder) is NumpyBertEncoder:  # (its subclasses compute otherwise)
        embedder.threads = 1
        embedder.together = together
        embedder.layers = [dataclasses.replace(layer, **{
            name: np.asfortranarray(getattr(layer, name)) for name in _DENSE})
            for layer in embedder.layers]
    return embedder
