"""`tkg bench query` on a tiny synthetic store: the figures are printed (never gated on), and
the IVF path (tables above `query.ann_min_rows`) answers within its groups."""

from __future__ import annotations

import contextlib
import io
import json

from tkg.pipeline.config import QueryConfig


def _bench_query(*flags: str) -> dict:
    from tkg.jobs.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "query", "--json", *flags]) == 0
    return json.loads(out.getvalue())


def test_bench_query_figures_describe_the_store_it_timed(tmp_path):
    """The row counts are the published store's (read back from its LanceDB tables), every
    query of the workload finds a full page of facts in its group (so what is timed is a
    real search, not an empty one), and --reuse times the kept store without rewriting it."""
    import lancedb

    workdir = tmp_path / "bench"
    flags = ("--facts", "2000", "--queries", "30", "--workdir", str(workdir))
    first = _bench_query(*flags)
    db = lancedb.connect(workdir / "snapshots" / "bench-1" / "lance")
    kinds = ("facts", "entities", "episodes", "communities")
    stored = {kind: db.open_table(kind).count_rows() for kind in kinds}
    assert {kind: first[kind] for kind in kinds} == stored
    assert first["facts_per_query"] == QueryConfig().limit
    assert first["reused_store"] is False and first["queries"] == 30

    written = (workdir / "snapshots" / "bench-1" / "manifest.json").stat().st_mtime_ns
    from tkg.query import candidates, methods

    stage_functions = (candidates.hydrate, candidates.start, methods.exact_cosine)
    again = _bench_query(*flags, "--reuse", "--profile", "10")
    assert again["reused_store"] is True and again["generate_s"] == 0.0
    # the stage profile: the stages a default search goes through, each timed, and the
    # stage functions given back unwrapped afterwards
    stages = again["profile_ms"]
    assert {"cosine, in memory", "BM25, in memory", "bfs (graph expansion)", "hydration",
            "episode scoring (turn windows, provenance, speakers, time)"} <= set(stages)
    assert 0 < stages["hydration"] < stages["search total"]
    assert (candidates.hydrate, candidates.start, methods.exact_cosine) == stage_functions
    assert (workdir / "snapshots" / "bench-1" / "manifest.json").stat().st_mtime_ns == written
    assert {kind: again[kind] for kind in kinds} == stored
    assert again["facts_per_query"] == QueryConfig().limit


def test_ivf_tables_answer_within_their_group(tmp_path):
    from tkg.jobs.bench.query import SyntheticEmbedder, synth_tables, write_store

    from tkg import query

    config = QueryConfig(ann_min_rows=1_000, ann_rows_per_partition=256, nprobes=4,
                         exact_scan_rows=0)  # every vector search through LanceDB
    tables, centroids = synth_tables(3_000, 32, 3, seed=1)
    figures = write_store(tmp_path, tables, 32, config)
    assert figures["facts"]["vector_index"] == "IVF_PQ"
    assert figures["entities"]["vector_index"] == "exact"  # 600 rows: below the threshold
    retriever = query.open(tmp_path, embedder=SyntheticEmbedder(centroids), config=config)
    fact = tables["facts"]["fact"][7].as_py()
    group = tables["facts"]["group_id"][7].as_py()
    result = retriever.search(fact, [group], limit=10)
    assert len(result.facts) == 10
    edges = set(tables["facts"].filter(
        tables["facts"]["group_id"].to_numpy(zero_copy_only=False) == group)["edge_id"]
        .to_pylist())
    assert {f.edge_id for f in result.facts} <= edges
    assert tables["facts"]["edge_id"][7].as_py() in {f.edge_id for f in result.facts}


def test_exact_scan_in_memory_ranks_as_lancedb_does(tmp_path):
    """The in-memory exact scan returns what LanceDB's exact search returns, for every
    kind, group set and point in both timelines (it only saves the index call)."""
    from tkg.jobs.bench.query import SyntheticEmbedder
    from tkg.query import search

    from tests.query_store import synthetic_snapshot, twin_scopes

    tables, centroids, snap, config = synthetic_snapshot(tmp_path, seed=2)
    embedder = SyntheticEmbedder(centroids)
    scopes = twin_scopes()
    compared = 0
    for kind in ("facts", "entities", "communities", "episodes"):
        assert snap.kinds[kind].vectors is not None
        for i, scope in enumerate(scopes):
            text = tables["facts"]["fact"][i * 11].as_py()
            vector = embedder.embed([text])[0]
            exact = search.exact_cosine(snap, kind, vector, scope, 15, config)
            indexed = search.start([search.cosine(snap.kinds[kind], vector, scope, 15,
                                                  config)]).result()[0]
            assert [r for r, _ in exact] == [r for r, _ in indexed], (kind, i)
            assert max((abs(a - b) for (_, a), (_, b) in zip(exact, indexed, strict=True)),
                       default=0) < 1e-4
            compared += len(exact)
    assert compared > 100
