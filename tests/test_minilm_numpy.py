"""The numpy BERT encoder gives sentence-transformers' vectors for the packaged MiniLM, and
a query with it imports neither torch nor sentence-transformers."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tkg.pipeline.config import EmbedConfig
from tkg.pipeline.embed import SentenceTransformerEmbedder, numpy_embedder, plain_layout

from tests.query_store import build_store

CORPUS = Path(__file__).parent / "corpus"


def real_sentences() -> list[str]:
    """A dozen corpus texts: messages, the longest documents, two long threads of messages
    (past max_seq_length and past the model's 512 positions), odd whitespace, an empty text."""
    messages = [json.loads(line)["content"]
                for line in (CORPUS / "conversations.jsonl").read_text().splitlines()]
    documents = sorted((json.loads(line).get("content") or "" for line in
                        (CORPUS / "documents.jsonl").read_text().splitlines()), key=len)
    return [*messages[:6], *documents[-2:], " ".join(messages[:20]), " ".join(messages),
            "  Where does Daniel Okafor live?  ", ""]


@pytest.mark.parametrize("max_seq_length", [128, 16])
def test_numpy_vectors_equal_sentence_transformers(max_seq_length: int) -> None:
    config = EmbedConfig(precision="float32", max_seq_length=max_seq_length, batch_size=4)
    texts = real_sentences()
    encoder = numpy_embedder(config)
    assert encoder is not None
    ours = encoder.embed(texts)
    theirs = SentenceTransformerEmbedder(config).embed(texts)
    assert ours.shape == theirs.shape == (len(texts), 384) and ours.dtype == np.float32
    cosines = np.sum(ours * theirs, axis=1)
    assert cosines.min() > 0.99999, cosines
    assert np.abs(ours - theirs).max() < 1e-5
    for long in texts[-4:-2]:  # truncated to max_seq_length, as sentence-transformers does
        assert len(encoder.tokenizer.encode(long).ids) == max_seq_length


def test_layout_of_the_packaged_model() -> None:
    layout = plain_layout(EmbedConfig())
    assert layout is not None
    assert (layout.pooling, layout.dim, layout.normalize, layout.transformer) == (
        "mean", 384, True, "")


def test_a_folder_of_another_layout_has_no_numpy_encoder(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True}))
    assert plain_layout(EmbedConfig(model=str(tmp_path))) is None
    assert numpy_embedder(EmbedConfig(model=str(tmp_path))) is None


@pytest.mark.parametrize("precision", ["float32", "auto"])
def test_a_cold_query_imports_torch_only_for_bfloat16(tmp_path: Path, precision: str) -> None:
    """A store whose manifest names the packaged MiniLM is queried by a fresh process: on
    numpy without torch in float32; in bfloat16 (`auto` where bf16 is the faster) the
    question's encoder is torch's."""
    from tkg.pipeline.config import TkgConfig
    from tkg.pipeline.embed import bf16_pays

    embed = EmbedConfig(precision=precision)
    root = build_store(tmp_path / "store", numpy_embedder(embed),
                       TkgConfig().model_copy(update={"embed": embed}))
    code = (
        "import sys, tkg.query as q\n"
        f"r = q.open({str(root)!r})\n"
        "hits = r.search('Where does Ana live?', 'g1', limit=3)\n"
        "assert 'Lisbon' in hits.facts[0].fact, hits\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    torch = precision == "auto" and bf16_pays()
    assert done.stdout.strip().splitlines()[-1] == ("['torch']" if torch else "[]")


def test_the_build_embeds_in_numpy_unless_bfloat16_is_chosen() -> None:
    """One rule for the driver and the actors: the same vectors from both. bfloat16, asked
    for or `auto` where bf16 is the faster, runs the same encoder's products on torch, for
    the vectors that only rank (episodes, facts); names and relation phrases stay float32."""
    from tkg.pipeline.config import TkgConfig
    from tkg.pipeline.embed import bf16_pays, build_embedder
    from tkg.pipeline.minilm_numpy import Bf16BertEncoder, NumpyBertEncoder

    def built(precision: str, ranked: bool = True) -> type:
        return type(build_embedder(TkgConfig().model_copy(update={"embed": EmbedConfig(
            precision=precision)}), ranked))

    assert built("float32") is NumpyBertEncoder
    assert built("bfloat16") is Bf16BertEncoder
    assert built("auto") is (Bf16BertEncoder if bf16_pays() else NumpyBertEncoder)
    assert built("bfloat16", ranked=False) is built("auto", ranked=False) is NumpyBertEncoder
