"""`python -m tkg.jobs.model_rates` at tiny shapes on the CPU: the texts of the corpus
build go out with the tokenizer, and both models' measurements run every line and report
their figures (the GPU figures in the README come from the same code at full shapes)."""

from __future__ import annotations

import json

from tkg.jobs import model_rates


def test_model_rates_runs_both_models_on_the_texts_a_build_embedded(corpus_build, tmp_path):
    store = corpus_build.snapshot.parent.parent
    counts = model_rates.dump_texts(str(store), tmp_path)
    assert counts["episodes_built"] == counts["episodes"] > 0
    assert counts["facts"] > 0 and counts["names"] > 0
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()

    report = model_rates.measure(tmp_path, tiny=True)
    assert report == json.loads((tmp_path / "model_rates.json").read_text())
    [embedded] = report["bge_m3"]["runs"]
    assert embedded["texts"] == counts["episodes"] + counts["facts"] + counts["names"]
    assert embedded["tokens"] >= embedded["texts"] and embedded["episodes_per_gpu_hour"] > 0
    [generated] = report["qwen3_8b"]["runs"]
    assert generated["completion_tokens_per_s"] > 0 and generated["episodes_per_gpu_hour"] > 0
