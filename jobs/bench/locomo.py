"""`tkg bench locomo`: retrieval on LoCoMo's real long conversations, for the configured
recipe and the flat baseline in one run. Figures only, never a gate.

LoCoMo (`../shared/data/locomo10.json`, CC BY-NC 4.0, evaluation only: it is read from there
and converted into a temporary folder, never into the project) has 10 conversations between
two people over up to 35 sessions. Each sample becomes a group, each session a conversation,
each turn a message whose id is its `dia_id`, stamped with the session's date plus
TURN_SECONDS per turn; a turn that shares an image keeps the image's caption. Questions of
categories 1-4 (multi-hop, temporal, open-domain, single-hop; 5 has no evidence) are asked of
their sample's group, and the ranked `episodes` list is scored against their evidence turns:
evidence recall@k (the share of evidence turns in the first k) and hit@k (any of them there).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tkg.jobs.bench.figures import SHARED_DATA, report

DEFAULT_DATA = SHARED_DATA / "locomo10.json"
TURN_SECONDS = 5
KS = (1, 5, 10)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SESSION = re.compile(r"^session_(\d+)$")


def session_time(text: str) -> datetime:
    """LoCoMo's "1:56 pm on 8 May, 2023" as UTC."""
    return datetime.strptime(" ".join(text.split()), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def convert(data: list[dict[str, Any]], out_dir: Path) -> tuple[Path, list[dict[str, Any]]]:
    """LoCoMo samples -> one JSONL input file (messages) and the questions of categories 1-4."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "locomo.jsonl"
    questions: list[dict[str, Any]] = []
    with path.open("w") as out:
        for sample in data:
            group = re.sub(r"[^A-Za-z0-9_-]", "-", sample["sample_id"])
            conversation = sample["conversation"]
            sessions = sorted(int(m.group(1)) for key in conversation
                              if (m := SESSION.match(key)))
            for number in sessions:
                start = session_time(conversation[f"session_{number}_date_time"])
                for index, turn in enumerate(conversation[f"session_{number}"]):
                    text = turn.get("text") or ""
                    if turn.get("blip_caption"):
                        text = f"{text} [shares {turn['blip_caption']}]".strip()
                    stamp = start + timedelta(seconds=TURN_SECONDS * index)
                    out.write(json.dumps({
                        "group_id": group, "id": turn["dia_id"], "kind": "message",
                        "timestamp": stamp.isoformat().replace("+00:00", "Z"),
                        "conversation_id": f"{group}-s{number}", "speaker": turn["speaker"],
                        "role": "user", "content": text}) + "\n")
            questions += [{"group_id": group, "question": q["question"],
                           "evidence": evidence_ids(q.get("evidence") or ()),
                           "category": int(q["category"])}
                          for q in sample["qa"] if int(q.get("category", 5)) in CATEGORIES
                          and q.get("evidence")]
    return path, questions


def evidence_ids(evidence: list[str]) -> list[str]:
    """Evidence turn ids; a few entries hold several ids in one string ("D8:6; D9:17")."""
    return [part for entry in evidence for part in re.split(r"[;\s]+", entry) if part]


def score(retriever: Any, questions: list[dict[str, Any]], recipe: str) -> dict[str, Any]:
    """Recall@k and hit@k per category (and overall) of one recipe's ranked episodes."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    milliseconds = []
    for q in questions:
        started = time.perf_counter()
        result = retriever.search(q["question"], [q["group_id"]], recipe=recipe, limit=max(KS))
        milliseconds.append((time.perf_counter() - started) * 1000)
        ranked = [e.source_id for e in result.episodes]
        evidence = set(q["evidence"])
        row: dict[str, float] = {}
        for k in KS:
            found = evidence & set(ranked[:k])
            row[f"recall@{k}"] = len(found) / len(evidence) if evidence else 0.0
            row[f"hit@{k}"] = float(bool(found))
        rows[CATEGORIES[q["category"]]].append(row)
        rows["overall"].append(row)
    figures: dict[str, Any] = {name: {"questions": len(found), **{metric: round(
        sum(r[metric] for r in found) / len(found), 4) for metric in found[0]}}
        for name, found in rows.items()}
    if milliseconds:  # per question: the question's embedding(s) and the search
        figures["search_ms"] = {f"p{p}": round(float(np.percentile(milliseconds, p)), 2)
                                for p in (50, 95, 99)}
    return figures


def bench_locomo(data_path: Path, config_path: str | None = None,
                 workdir: str | None = None, samples: int | None = None,
                 store: str | None = None) -> dict[str, Any]:
    """Convert, build (or reuse `store`, a store built from the same conversion: evaluation
    alone takes a minute or two where a build takes ten), and score both recipes."""
    from tkg.pipeline.build import build
    from tkg.pipeline.config import load_config
    from tkg.query.recipes import BASELINE

    from tkg import query

    if not data_path.is_file():
        raise FileNotFoundError(f"{data_path} not found (LoCoMo is read from ../shared/data)")
    data = json.loads(data_path.read_text())[:samples]
    config = load_config(config_path)
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tkg-locomo-"))
    inputs, questions = convert(data, base / "inputs")
    started = time.perf_counter()
    episodes, build_seconds = None, None
    if store is None:
        store = str(base / "store")
        episodes = build(config, [str(inputs)], store).summary.get("episodes")
        build_seconds = round(time.perf_counter() - started, 1)
    retriever = query.open(store)
    if episodes is None:
        episodes = retriever.snapshot().kinds["episodes"].rows
    recipe = retriever.recipe().name
    figures = {"samples": len(data), "questions": len(questions), "episodes": episodes,
               "build_seconds": build_seconds, "store": store, "recipes": {}}
    for name in dict.fromkeys([recipe, BASELINE]):
        started = time.perf_counter()
        figures["recipes"][name] = score(retriever, questions, name)
        figures["recipes"][name]["seconds"] = round(time.perf_counter() - started, 1)
    return figures


def print_bench(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tkg bench locomo: {figures['samples']} samples, "
                        f"{figures['questions']} questions, {figures['episodes']} episodes, "
                        + (f"build {figures['build_seconds']} s"
                         if figures["build_seconds"] is not None
                         else f"store {figures['store']} (not rebuilt)"))
    metrics = [f"{m}@{k}" for m in ("recall", "hit") for k in KS]
    for column in ("recipe", "category", "questions", *metrics):
        table.add_column(column, justify="left" if column in ("recipe", "category")
                         else "right")
    for name, categories in figures["recipes"].items():
        for category in ("overall", *CATEGORIES.values()):
            row = categories.get(category)
            if row:
                table.add_row(name, category, str(row["questions"]),
                              *(f"{row[m]:.3f}" for m in metrics))
    console = Console(width=140)
    console.print(table)
    for name, categories in figures["recipes"].items():
        if "search_ms" in categories:
            timing = categories["search_ms"]
            console.print(f"{name}: search per question p50 {timing['p50']} ms, p95 "
                          f"{timing['p95']} ms, p99 {timing['p99']} ms")


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("locomo", help="LoCoMo (../shared/data): evidence recall@k and "
                               "hit@k per category, configured recipe and flat baseline")
    bench.add_argument("--data", default=str(DEFAULT_DATA))
    bench.add_argument("--config", default=None)
    bench.add_argument("--workdir", default=None, help="keep inputs and store here")
    bench.add_argument("--samples", type=int, default=None, help="only the first N samples")
    bench.add_argument("--store", default=None, help="score this store, built from the same "
                       "data, instead of building one")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    figures = bench_locomo(Path(args.data), config_path=args.config, workdir=args.workdir,
                           samples=args.samples, store=args.store)
    return report(figures, args.json, print_bench)
