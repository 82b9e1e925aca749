"""The query's embedder (`tkg.query.embedding`) gives the build encoder's vectors, bit for bit:
a ranking never moves because a question was embedded by the faster form."""

import json
from pathlib import Path

import numpy as np
import pytest
from tkg.pipeline.config import EmbedConfig
from tkg.pipeline.embed import numpy_embedder
from tkg.query.embedding import for_questions
from tkg.query.search import HELPERS, together

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
    assert (build.together, query.together) == (None, together)
    # one question, a question and its unnamed form (what a search embeds), a batch, a text
    # past max_seq_length
    calls = ([[q] for q in questions[:4]] + [questions[i:i + 2] for i in range(4, 12, 2)]
             + [messages[:12], [" ".join(messages[:40])]])
    # a question and its form without a speaker's name: far shorter, padded when batched
    calls += [[q, " ".join(q.split()[2:])] for q in questions[12:16]]
    halves = []  # (the query's dense products, in two halves of their columns at once)
    query.together = lambda calls: halves.append(len(calls)) or together(calls)
    for texts in calls:
        halves.clear()
        assert np.array_equal(build.embed(texts), query.embed(texts)), texts
        assert halves and set(halves) == {2}


def test_together_runs_every_call_once_in_order_and_never_waits_on_itself() -> None:
    import threading

    seen = []

    def call(i: int) -> int:
        seen.append(threading.get_ident())
        return i * i

    assert together([lambda i=i: call(i) for i in range(20)]) == [i * i for i in range(20)]
    assert len(seen) == 20
    # a call that itself runs `together` while every helper is busy finishes (not stuck)
    nested = [lambda: together([lambda j=j: j for j in range(3)]) for _ in range(HELPERS + 2)]
    assert together(nested) == [[0, 1, 2]] * (HELPERS + 2)
    with pytest.raises(ZeroDivisionError):
        together([lambda: 1, lambda: 1 // 0, lambda: 2])


def test_other_embedders_are_left_as_they_are() -> None:
    from tkg.pipeline.synthetic_embed import SyntheticEmbedder

    embedder = SyntheticEmbedder(np.eye(4, 8, dtype=np.float32))
    assert for_questions(embedder) is embedder


def test_bfloat16_questions_are_near_float32_and_the_same_every_time() -> None:
    """A snapshot built in bfloat16 is asked in bfloat16: a question's texts in one padded
    batch (one pass of the model for the question and its unnamed form), near the float32
    vectors and the same bits each time the same question comes."""
    from tkg.pipeline.minilm_numpy import Bf16BertEncoder
    from tkg.query.embedding import question_embedder

    questions = [json.loads(line)["question"]
                 for line in (TESTS / "questions" / "corpus.jsonl").read_text().splitlines()]
    query = question_embedder(EmbedConfig(precision="bfloat16", threads_per_actor=2))
    build = numpy_embedder(EmbedConfig(precision="float32"))
    assert type(query) is Bf16BertEncoder and query.padded and query.threads == 1
    assert type(question_embedder(EmbedConfig(precision="float32"))).__name__ == \
        "NumpyBertEncoder"
    for question in questions[:8]:
        pair = [question, " ".join(question.split()[2:]) or question]
        vectors = query.embed(pair)
        assert np.array_equal(vectors, query.embed(pair))
        assert vectors.shape == (2, build.dim) and vectors.dtype == np.float32
        assert float((vectors * build.embed(pair)).sum(axis=1).min()) > 0.9999
        assert np.abs(np.linalg.norm(vectors, axis=1) - 1).max() < 1e-5
