"""`tkg bench communities --nodes N --edges M [--json]`: label propagation on a synthetic
planted-partition graph. Prints figures (seconds per step, modularity, how well the planted
communities are recovered, peak memory); never gates on time.

The graph: `nodes` entities in planted communities of `community_size`, `edges` facts, a
share `p_in` of them inside a community, the rest between random entities. Inputs are the
same Arrow tables a snapshot holds, and the refresh runs the same functions as
`tkg communities refresh`, without the embedding of names (a model) and without an LLM.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.jobs.bench.figures import print_figures, report

SYLLABLES = ("ka", "lo", "mi", "ra", "ten", "vo", "sha", "dri", "an", "bel", "cor", "du",
             "el", "fin", "gar", "hul", "is", "jor", "kel", "lum", "mar", "nor", "ost", "pel")
TS = pa.timestamp("us", tz="UTC")


def _words(count: int, rng: np.random.Generator) -> list[str]:
    """`count` distinct pronounceable words (names of the synthetic entities)."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        parts = rng.integers(0, len(SYLLABLES), (count, 3))
        for row in parts:
            word = "".join(SYLLABLES[i] for i in row).capitalize()
            if word not in seen:
                seen.add(word)
                words.append(word)
                if len(words) == count:
                    break
        if len(seen) >= len(SYLLABLES) ** 3:
            break
    return words


def planted_partition(nodes: int, edges: int, *, community_size: int = 50, p_in: float = 0.8,
                      seed: int = 0, group_id: str = "bench"
                      ) -> tuple[dict[str, pa.Table], np.ndarray]:
    """Snapshot-shaped tables (entities, facts, mentions, no communities yet) and the
    planted community of each entity (in entity-id order)."""
    rng = np.random.default_rng(seed)
    planted = rng.permutation(nodes) // community_size  # entity i is in planted[i]
    order = np.argsort(planted, kind="stable")
    sizes = np.bincount(planted)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    src = rng.integers(0, nodes, edges)
    dst = rng.integers(0, nodes, edges)
    inside = rng.random(edges) < p_in
    block = planted[src[inside]]
    dst[inside] = order[starts[block] + (rng.random(inside.sum()) * sizes[block]).astype(int)]
    ids = pa.array([f"e{i:09d}" for i in range(nodes)])
    first, last = _words(4_000, rng), _words(20_000, rng)
    names = pa.array([f"{first[a]} {last[b]}" for a, b in zip(
        rng.integers(0, len(first), nodes).tolist(), rng.integers(0, len(last), nodes).tolist(),
        strict=True)])
    src_a, dst_a = pa.array(src), pa.array(dst)
    facts = pa.table({
        "group_id": pa.array(np.full(edges, group_id)),
        "source_entity_id": ids.take(src_a), "target_entity_id": ids.take(dst_a),
        "fact": pc.binary_join_element_wise(names.take(src_a), "works with",
                                            names.take(dst_a), " "),
        "n_episodes": pa.array(rng.integers(1, 4, edges)),
        "expired_at": pa.nulls(edges, TS), "invalid_at": pa.nulls(edges, TS),
    })
    entities = pa.table({
        "entity_id": ids, "group_id": pa.array(np.full(nodes, group_id)), "name": names,
        "summary": pa.nulls(nodes, pa.string()),
        "mention_count": pa.array(rng.integers(1, 20, nodes)),
    })
    mentions = pa.table({"episode_id": pa.array([], pa.string()),
                         "entity_id": pa.array([], pa.string()),
                         "group_id": pa.array([], pa.string())})
    return {"entities": entities, "facts": facts, "mentions": mentions}, planted


def bench_communities(nodes: int, edges: int, *, community_size: int = 50, p_in: float = 0.8,
                      seed: int = 0, trace: bool = False) -> dict[str, Any]:
    """Generate, then time graph construction, label propagation and the whole refresh.
    `trace` adds tracemalloc's peak of Python-side allocations (slower)."""
    from tkg.pipeline import communities
    from tkg.pipeline.config import CommunitiesConfig

    config = CommunitiesConfig()
    started = time.perf_counter()
    tables, planted = planted_partition(nodes, edges, community_size=community_size,
                                        p_in=p_in, seed=seed)
    generate = time.perf_counter() - started
    rss_before = _peak_rss_gb()
    if trace:
        tracemalloc.start()
    timings: dict[str, float] = {}
    started, started_cpu = time.perf_counter(), time.process_time()
    graph = communities.build_graph("bench", tables["entities"], tables["facts"],
                                    tables["mentions"], config)
    timings["graph_arrays"] = time.perf_counter() - started
    timings["graph_arrays_cpu"] = time.process_time() - started_cpu
    result = communities.group_communities(graph, communities.Previous.empty(), config,
                                           datetime.now(UTC), "refresh", timings=timings)
    whole, whole_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    traced = tracemalloc.get_traced_memory()[1] / 2**30 if trace else None
    if trace:
        tracemalloc.stop()
    g = communities.to_igraph(graph)
    modularity = g.modularity(np.where(result.assign >= 0, result.assign,
                                       result.assign.max() + 1 + np.arange(graph.n)).tolist(),
                              weights=graph.weight)
    sizes = result.rows["size"].to_numpy() if result.rows.num_rows else np.zeros(1)
    return {
        "nodes": nodes, "edges": edges, "graph_edges": len(graph.weight),
        "community_size": community_size, "p_in": p_in,
        "generate_seconds": round(generate, 2),
        "graph_seconds": round(timings["graph_arrays"] + timings["igraph_graph"], 2),
        "label_propagation_seconds": round(timings["label_propagation"], 2),
        "ids_seconds": round(timings["ids"], 2),
        "summaries_seconds": round(timings["summaries"], 2),
        "refresh_seconds": round(whole, 2),
        # CPU seconds (all threads): what the steps cost on a shared, loaded machine
        "graph_cpu_seconds": round(timings["graph_arrays_cpu"] + timings["igraph_graph_cpu"],
                                   2),
        "label_propagation_cpu_seconds": round(timings["label_propagation_cpu"], 2),
        "summaries_cpu_seconds": round(timings["summaries_cpu"], 2),
        "refresh_cpu_seconds": round(whole_cpu, 2),
        "communities": result.rows.num_rows,
        "median_size": float(np.median(sizes)), "max_size": int(sizes.max()),
        "in_communities": int((result.assign >= 0).sum()),
        "modularity": round(modularity, 4),
        "nmi_vs_planted": round(communities.normalized_mutual_info(
            planted, np.where(result.assign >= 0, result.assign, -1 - np.arange(graph.n))), 4),
        "peak_rss_gb": _peak_rss_gb(), "peak_rss_gb_before_refresh": rss_before,
        "tracemalloc_peak_gb": round(traced, 3) if traced is not None else None,
    }


def _peak_rss_gb() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30, 3)


def print_bench(figures: dict[str, Any]) -> None:
    print_figures(f"tkg bench communities: {figures['nodes']:,} entities, "
                  f"{figures['edges']:,} facts", figures)


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("communities", help="label propagation, planted partition")
    bench.add_argument("--nodes", type=int, default=1_000_000, help="entities")
    bench.add_argument("--edges", type=int, default=5_000_000, help="facts")
    bench.add_argument("--community-size", type=int, default=50)
    bench.add_argument("--p-in", type=float, default=0.8, help="share of facts inside")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--tracemalloc", action="store_true",
                       help="also trace Python allocations (slower)")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    figures = bench_communities(args.nodes, args.edges, community_size=args.community_size,
                                p_in=args.p_in, seed=args.seed, trace=args.tracemalloc)
    return report(figures, args.json, print_bench)
