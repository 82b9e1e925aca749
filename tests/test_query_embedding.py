"""The query's embedder (`tkg.query.embedding`) gives the build encoder's vectors, bit for bit:
a ranking never moves because a question was embedded by the faster form."""

import json
from pathlib import Path

import numpy as np
from tkg.pipeline.config import EmbedConfig
from tkg.pipeline.embed import numpy_embedder
from tkg.query.embedding import for_questions

TESTS = Path(__file__).parent


def test_question_vectors_are_the_build_encoders_bit_for_bit() -> None:
    questions = [json.loads(line)["question"]
                 for line in (TESTS / "questions" / "corpus.jsonl").read_text().splitlines()]
    messages = [json.loads(line)["content"] for line in
                (TESTS / "corpus" / "conversations.jsonl").read_text().splitlines()]
    config = EmbedConfig(precision="float32", threads_per_actor=2)
    build, query = numpy_embedder(config), for_questions(numpy_embedder(config))
    assert query.layers[0].qkv.flags.f_contiguous and not build.layers[0].qkv.flags.f_contiguous
    assert (build.threads, query.threads) == (2, 1)
    # one question, a question and its unnamed form (what a search embeds), a batch, a text
    # past max_seq_length
    calls = ([[q] for q in questions[:4]] + [questions[i:i + 2] for i in range(4, 12, 2)]
             + [messages[:12], [" ".join(messages[:40])]])
    for texts in calls:
        assert np.array_equal(build.embed(texts), query.embed(texts)), texts


def test_other_embedders_are_left_as_they_are() -> None:
    from tkg.pipeline.synthetic_embed import SyntheticEmbedder

    embedder = SyntheticEmbedder(np.eye(4, 8, dtype=np.float32))
    assert for_questions(embedder) is embedder
