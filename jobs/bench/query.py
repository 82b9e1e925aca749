"""`tkg bench query --facts N`: query latency of the default recipe on a synthetic store.

The store has N facts and, in proportion, N/5 entities, N/4 episodes, N/250 communities,
spread over `groups` tenants; texts are drawn from a Zipf vocabulary (so BM25 sees skewed
term frequencies) and vectors from topic clusters (so IVF partitions mean something), of
the configured width. Queries are embedded by a synthetic embedder (a seeded vector per
text), so what is timed is retrieval, not the model: per query, search (cosine + BM25 over
four tables) + 2-hop BFS + RRF + hydration + the context string. Prints p50/p95/p99 in ms
and the index build time. Never gates on time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tkg.jobs.bench.figures import print_figures, report
from tkg.pipeline import schema, store
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.synthetic_embed import TOPICS, SyntheticEmbedder, model_name
from tkg.pipeline.synthetic_embed import centroids as _centroids

__all__ = ["SyntheticEmbedder", "bench_query", "synth_tables", "write_store"]
VOCABULARY = 20_000
RELATIONS = ("WORKS_AT", "LIVES_IN", "KNOWS", "OWNS", "ATTENDS", "REPORTS_TO", "MANAGES",
             "VISITED", "BOUGHT", "STATUS")
EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
BUILT = datetime(2025, 1, 1, tzinfo=UTC)


def _vectors(rng: np.random.Generator, centroids: np.ndarray, topics: np.ndarray,
             chunk: int = 100_000) -> pa.FixedSizeListArray:
    dim = centroids.shape[1]
    parts = []
    for start in range(0, len(topics), chunk):
        t = topics[start:start + chunk]
        v = centroids[t] + 0.5 * rng.standard_normal((len(t), dim), dtype=np.float32) / np.sqrt(dim)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        parts.append(v.astype(np.float32).reshape(-1))
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), dim)


def _texts(rng: np.random.Generator, count: int, words: int, vocab: np.ndarray,
           prefix: list[str] | None = None) -> list[str]:
    ids = np.minimum(rng.zipf(1.3, size=(count, words)) - 1, len(vocab) - 1)
    body = [" ".join(vocab[row]) for row in ids]
    return [f"{p} {b}" for p, b in zip(prefix, body, strict=True)] if prefix else body


def synth_tables(facts: int, dim: int, groups: int, seed: int) -> tuple[dict[str, pa.Table],
                                                                         np.ndarray]:
    """The published tables of a synthetic store, and its topic centroids."""
    rng = np.random.default_rng(seed)
    centroids = _centroids(dim, seed, rng)
    vocab = np.array([f"w{i}" for i in range(VOCABULARY)])
    n_ent, n_ep = max(facts // 5, groups * 2), max(facts // 4, groups)
    n_com = max(facts // 250, groups)
    group_names = np.array([f"g{i:03d}" for i in range(groups)])

    ent_group = np.arange(n_ent) % groups
    ent_ids = np.array([f"e{i}" for i in range(n_ent)])
    names = [f"Entity{i}" for i in range(n_ent)]
    first_seen = EPOCH + np.arange(n_ent) % 1800 * timedelta(days=1)
    entities = pa.table({
        "entity_id": ent_ids, "group_id": group_names[ent_group], "name": names,
        "labels": pa.array([["Thing"]] * n_ent, pa.list_(pa.string())),
        "summary": _texts(rng, n_ent, 8, vocab),
        "name_embedding": _vectors(rng, centroids, rng.integers(TOPICS, size=n_ent)),
        "created_at": pa.array([BUILT] * n_ent, schema.TS), "first_seen": pa.array(
            list(first_seen), schema.TS), "mention_count": rng.integers(1, 20, size=n_ent)})

    ep_group = np.arange(n_ep) % groups
    ep_ids = np.array([f"p{i}" for i in range(n_ep)])
    ep_time = [EPOCH + timedelta(minutes=int(m)) for m in rng.integers(0, 5 * 525_600, n_ep)]
    episodes = pa.table({
        "episode_id": ep_ids, "group_id": group_names[ep_group], "source_id": ep_ids,
        "kind": ["message"] * n_ep,
        "conversation_id": [f"c{i // 20}" for i in range(n_ep)],
        "content": _texts(rng, n_ep, 24, vocab),
        "valid_at": pa.array(ep_time, schema.TS), "created_at": pa.array([BUILT] * n_ep,
                                                                         schema.TS),
        "content_embedding": _vectors(rng, centroids, rng.integers(TOPICS, size=n_ep))})

    src = rng.integers(n_ent, size=facts)
    fact_group = ent_group[src]
    per_group = n_ent // groups
    tgt = fact_group + groups * rng.integers(per_group, size=facts)
    episode_of = fact_group + groups * rng.integers(n_ep // groups, size=facts)
    relation = np.array(RELATIONS)[rng.integers(len(RELATIONS), size=facts)]
    valid = rng.integers(0, 1800, size=facts)
    closed = rng.random(facts) < 0.2
    invalid = [EPOCH + timedelta(days=int(v + 30)) if c else None
               for v, c in zip(valid, closed, strict=True)]
    prefix = [f"{names[s]} {r.lower()} {names[t]}" for s, r, t in zip(src, relation, tgt,
                                                                       strict=True)]
    facts_table = pa.table({
        "edge_id": [f"f{i}" for i in range(facts)], "version": pa.array(
            np.ones(facts, dtype=np.int32)), "group_id": group_names[fact_group],
        "source_entity_id": ent_ids[src], "target_entity_id": ent_ids[tgt],
        "relation": relation, "fact": _texts(rng, facts, 6, vocab, prefix),
        "fact_embedding": _vectors(rng, centroids, rng.integers(TOPICS, size=facts)),
        "episode_ids": pa.array([[e] for e in ep_ids[episode_of]], pa.list_(pa.string())),
        "valid_at": pa.array([EPOCH + timedelta(days=int(v)) for v in valid], schema.TS),
        "invalid_at": pa.array(invalid, schema.TS),
        "created_at": pa.array([BUILT] * facts, schema.TS)})

    mentions = pa.table({"episode_id": np.concatenate([ep_ids, ep_ids]),
                         "entity_id": np.concatenate([ent_ids[ep_group + groups * rng.integers(
                             per_group, size=n_ep)] for _ in range(2)]),
                         "group_id": np.concatenate([group_names[ep_group]] * 2)})
    communities = pa.table({
        "community_id": [f"k{i}" for i in range(n_com)],
        "group_id": group_names[np.arange(n_com) % groups],
        "name": [f"Community{i}" for i in range(n_com)], "summary": _texts(rng, n_com, 16, vocab),
        "name_embedding": _vectors(rng, centroids, rng.integers(TOPICS, size=n_com)),
        "size": rng.integers(2, 50, size=n_com), "created_at": pa.array([BUILT] * n_com,
                                                                        schema.TS)})
    tables = {"entities": entities, "episodes": episodes, "facts": facts_table,
              "mentions": mentions, "communities": communities}
    published = {name: schema.conform(t, schema.PUBLISHED[name](dim)) for name, t in tables.items()}
    return published, centroids


def write_store(root: Path, tables: dict[str, pa.Table], dim: int,
                config: QueryConfig, seed: int = 0, run_id: str = "bench-1") -> dict[str, Any]:
    """A published snapshot `run_id` of the synthetic tables: mentions as Parquet (the graph
    reads them), the retrieval indexes, a manifest, CURRENT."""
    from tkg.pipeline.index import build_indexes

    snapshot = store.prepare_snapshot(root, run_id)
    (snapshot / "mentions").mkdir(parents=True)
    pq.write_table(tables["mentions"], snapshot / "mentions" / "part-0.parquet")
    figures = build_indexes(snapshot, dim, config, tables=tables)
    embed = {"backend": "synthetic", "model": model_name(dim, seed)}
    store.write_manifest(snapshot, {"run_id": run_id, "embedding": {**embed, "dim": dim},
                                    "config": {"query": config.model_dump(), "embed": embed},
                                    "retrieval": figures})
    store.switch_current(root, run_id)
    return figures


def _workload(tables: dict[str, pa.Table], queries: int, seed: int) -> list[dict[str, Any]]:
    """Varied queries: words of a random fact of a random group; some point-in-time."""
    rng = np.random.default_rng(seed + 1)
    facts = tables["facts"]
    picks = rng.integers(facts.num_rows, size=queries)
    texts = facts["fact"].take(pa.array(picks)).to_pylist()
    groups = facts["group_id"].take(pa.array(picks)).to_pylist()
    work = []
    for i, (text, group) in enumerate(zip(texts, groups, strict=True)):
        words = text.split()
        chosen = rng.choice(len(words), size=min(4, len(words)), replace=False)
        query: dict[str, Any] = {"text": " ".join(words[j] for j in sorted(chosen)),
                                 "group_ids": [group]}
        if i % 5 == 1:
            query["as_of"] = (EPOCH + timedelta(days=int(rng.integers(1800)))).isoformat()
        work.append(query)
    return work


def _reusable(root: Path, facts: int, dim: int) -> dict[str, Any] | None:
    """The retrieval figures of a bench store already in `root` with these sizes, if any."""
    try:
        manifest = store.read_manifest(store.current_snapshot(root))
    except store.StoreError:
        return None
    retrieval = manifest.get("retrieval") or {}
    if (manifest.get("embedding", {}).get("dim") == dim
            and retrieval.get("facts", {}).get("rows") == facts):
        return retrieval
    return None


class StageTimer:
    """Wall time per stage of the searches run inside it (`with StageTimer() as timer`):
    the stage functions are wrapped for the while, so the search code carries no timing of
    its own. A stage nested in another counts in both (BFS's seeds fuse lists by RRF)."""

    def __init__(self) -> None:
        from tkg.query import api, candidates, methods

        self.seconds: dict[str, float] = {}
        embed = "embed_all" if "embed_all" in vars(api.Retriever) else "embed"  # (older code)
        self._patches = [
            ("embedding", api.Retriever, embed),
            ("cosine, in memory", methods, "exact_cosine"),
            ("BM25, in memory", methods, "memory_bm25"),
            ("LanceDB searches (waited for)", candidates, "start"),
            ("bfs (graph expansion)", candidates.OneSearch, "expansion"),
            ("linked (named people and things)", methods.Linked, "hits"),
            ("fusion and reranking (facts, entities, communities)", candidates.OneSearch,
             "_fused"),
            ("fusion and reranking (facts, entities, communities)", candidates.OneSearch,
             "_reranked"),
            ("episode scoring (turn windows, provenance, speakers, time)", candidates,
             "fused_episodes"),
            ("hydration", candidates, "hydrate")]
        self._saved: list[tuple[Any, str, Any]] = []

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def _timed(self, stage: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(stage, time.perf_counter() - started)

        def started_searches(*args: Any, **kwargs: Any) -> Any:
            future = fn(*args, **kwargs)  # (LanceDB works on its own loop: time the wait)
            result = future.result
            future.result = lambda *a, **k: timed_result(result, *a, **k)
            return future

        def timed_result(result: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return result(*args, **kwargs)
            finally:
                self.add(stage, time.perf_counter() - started)

        return started_searches if fn.__name__ == "start" else timed

    def __enter__(self) -> StageTimer:
        for stage, owner, name in self._patches:
            original = owner.__dict__[name]
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(stage, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def stage_profile(retriever: Any, work: list[dict[str, Any]], context_tokens: int
                  ) -> dict[str, float]:
    """Milliseconds per query of each stage of the default recipe (`StageTimer`), plus the
    context string and the JSON of `tkg search --json`, over `work`; `other` is the rest
    of the search (scope, candidate lists, the recipe's plumbing)."""
    import json

    from tkg.query.context import build_context

    total = 0.0
    with StageTimer() as timer:
        for q in work:
            started = time.perf_counter()
            result = retriever.search(q["text"], q["group_ids"], as_of=q.get("as_of"))
            total += time.perf_counter() - started
            started = time.perf_counter()
            build_context(result, context_tokens)
            timer.add("context string", time.perf_counter() - started)
            started = time.perf_counter()
            json.dumps(result.to_dict(), ensure_ascii=False).encode()
            timer.add("serialization (search JSON)", time.perf_counter() - started)
    stages = dict(timer.seconds)
    inside = sum(v for k, v in stages.items() if k not in ("context string",
                                                            "serialization (search JSON)"))
    stages["other (scope, lists, plumbing)"] = max(total - inside, 0.0)
    stages["search total"] = total
    return {k: round(v * 1000 / max(len(work), 1), 3) for k, v in stages.items()}


def bench_query(facts: int, queries: int = 1_000, dim: int = 384, groups: int = 10,
                workdir: str | None = None, seed: int = 0,
                config: QueryConfig | None = None, reuse: bool = False,
                profile: int = 0) -> dict[str, Any]:
    """Build (or, with `reuse`, keep the store of an earlier run in `workdir`) and time."""
    from tkg.query.context import build_context

    from tkg import query

    config = config or QueryConfig()
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tkg-bench-query-"))
    index = _reusable(root, facts, dim) if reuse and workdir else None
    generated = 0.0
    if index is None:
        if root.exists() and any(root.iterdir()):
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        tables, _ = synth_tables(facts, dim, groups, seed)
        generated = time.perf_counter() - started
        index = write_store(root, tables, dim, config, seed)
        del tables
    started = time.perf_counter()
    retriever = query.open(root, config=config)  # (the manifest names the synthetic embedder)
    opened = time.perf_counter() - started
    snapshot = retriever.snapshot()
    work = _workload({"facts": snapshot.kinds["facts"].meta}, queries, seed)
    counts = {name: snapshot.kinds[name].rows for name in ("facts", "entities", "episodes",
                                                            "communities")}
    for q in work[:20]:  # warm-up: page caches, index metadata
        retriever.search(q["text"], q["group_ids"], as_of=q.get("as_of"))
    latencies, returned = [], 0
    from rich.progress import track

    for q in track(work, description=f"{queries} queries", transient=True):
        t0 = time.perf_counter()
        result = retriever.search(q["text"], q["group_ids"], as_of=q.get("as_of"))
        build_context(result, config.context_tokens)
        latencies.append((time.perf_counter() - t0) * 1000)
        returned += len(result.facts)
    ms = np.array(latencies)
    stages = stage_profile(retriever, work[:profile], config.context_tokens) if profile else None
    figures = {
        **counts, "dim": dim, "groups": groups, "queries": queries,
        "recipe": config.recipe, "vector_index": {k: v["vector_index"] for k, v in index.items()
                                                  if isinstance(v, dict)},
        "reused_store": generated == 0.0,
        "generate_s": round(generated, 1), "index_build_s": index["seconds"],
        "index_build_s_per_table": {k: v["seconds"] for k, v in index.items()
                                    if isinstance(v, dict)},
        "open_s": round(opened, 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p95_ms": round(float(np.percentile(ms, 95)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "mean_ms": round(float(ms.mean()), 2),
        "facts_per_query": round(returned / max(queries, 1), 2),
        "store": str(root),
        **({"profile_queries": profile, "profile_ms": stages} if stages else {}),
    }
    if not workdir:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def print_bench(figures: dict[str, Any]) -> None:
    print_figures(f"tkg bench query: {figures['facts']:,} facts, {figures['dim']}-d", figures)


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("query", help="query latency on a synthetic store")
    bench.add_argument("--facts", type=int, default=100_000)
    bench.add_argument("--queries", type=int, default=1_000)
    bench.add_argument("--dim", type=int, default=384)
    bench.add_argument("--groups", type=int, default=10)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--workdir", default=None, help="keep the synthetic store here")
    bench.add_argument("--reuse", action="store_true",
                       help="time the store an earlier run kept in --workdir (same sizes)")
    bench.add_argument("--profile", type=int, default=0, metavar="N",
                       help="after timing, run the first N queries again with a stage-by-stage "
                       "profile (ms per query per stage; not part of the timed figures)")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    figures = bench_query(args.facts, queries=args.queries, dim=args.dim, groups=args.groups,
                          workdir=args.workdir, seed=args.seed, reuse=args.reuse,
                          profile=args.profile)
    return report(figures, args.json, print_bench)
