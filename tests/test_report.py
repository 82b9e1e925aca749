"""`tkg report`: generated against the session's corpus store (every section present, counts
exact) and against an empty snapshot (every section still renders, saying "none yet")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tkg.jobs import report
from tkg.jobs.cli import main


def section(page: str, key: str) -> str:
    match = re.search(rf'<section id="{key}">(.*?)</section>', page, re.S)
    assert match, f"section {key} missing"
    return match.group(1)


def empty_store(root: Path, run_id: str = "empty-1", summary: dict | None = None) -> Path:
    """A published snapshot whose tables all exist and are empty (no Ray needed)."""
    from tkg.pipeline import schema, store

    snapshot = store.prepare_snapshot(root, run_id)
    for table, table_schema in schema.PUBLISHED.items():
        store.write_empty(snapshot / table, table_schema(384))
    store.build_catalog(snapshot)
    store.write_manifest(snapshot, {"run_id": run_id, "created_at": "2026-01-01T00:00:00+00:00",
                                    "embedding": {"model": "m", "dim": 384},
                                    "summary": summary or {}})
    store.switch_current(root, run_id)
    return root


def test_report_on_corpus(corpus_build, corpus_db, tmp_path, capsys):
    store_dir = corpus_build.snapshot.parent.parent
    out = tmp_path / "report.html"
    assert main(["report", "--store", str(store_dir), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    for s in report.SECTIONS:
        assert f"<h2>{s.title}</h2>" in section(page, s.key)
    assert "corpus-1" in page
    # self-contained: charts inline, nothing fetched
    assert page.count('src="data:image/png;base64,') >= 3
    assert not re.search(r'(src|href)="https?:', page)
    assert "<script" not in page

    def count(sql: str) -> int:
        return corpus_db.execute(sql).fetchone()[0]

    counts = section(page, "counts")
    for label, sql in (("episodes", "SELECT count(*) FROM episodes"),
                       ("entities", "SELECT count(*) FROM entities"),
                       ("facts_current", "SELECT count(*) FROM facts_current")):
        assert f'<td>{label}</td><td class="num">{count(sql):,}</td>' in counts
    assert '<td>acme</td><td class="num">141</td>' in counts  # episodes of acme
    stages = section(page, "stages")
    assert all(f"<td>{stage}</td>" in stages for stage in ("extract", "embed", "publish"))
    invalidated = count("SELECT count(*) FROM facts_current WHERE invalid_at IS NOT NULL")
    assert invalidated > 0
    assert "invalidated per month" in section(page, "facts")
    top = corpus_db.execute(
        "SELECT name FROM entities ORDER BY mention_count DESC, group_id, name LIMIT 1").fetchone()
    assert f"<td>{top[0]}</td>" in section(page, "entities")
    rejects = count("SELECT count(*) FROM rejects")
    assert (report.NONE_YET in section(page, "rejects")) == (rejects == 0)
    communities = count("SELECT count(*) FROM communities")
    assert (report.NONE_YET in section(page, "communities")) == (communities == 0)
    # the largest communities as bars (not one bar per distinct size, each of height 1)
    assert section(page, "communities").count("data:image/png") == (1 if communities else 0)
    # the runs table stays narrow: one row per run, seven columns
    runs = section(page, "runs")
    assert runs.count("<th>") == 7 and "corpus-1 (succeeded)" in runs
    # a picture of the graph around the entity with the most current facts
    hub = corpus_db.execute("""
        SELECT e.name FROM facts_current f JOIN entities e ON e.group_id = f.group_id
             AND e.entity_id IN (f.source_entity_id, f.target_entity_id)
        WHERE f.source_entity_id <> f.target_entity_id
        GROUP BY e.entity_id, e.group_id, e.name ORDER BY count(*) DESC, e.group_id, e.name
        LIMIT 1""").fetchone()[0]
    graph = section(page, "graph")
    assert f"<p>{hub} (group " in graph and graph.count("data:image/png") == 1


def test_report_is_written_beside_the_store_by_default(tmp_path, capsys):
    store_dir = empty_store(tmp_path / "stores" / "prod")
    assert main(["report", "--store", str(store_dir)]) == 0
    out = tmp_path / "stores" / "prod-report.html"
    assert f"wrote {out}" in capsys.readouterr().out and out.is_file()
    assert main(["report", "--store", "s3://bucket/tkg"]) == 2
    assert "--out FILE.html" in capsys.readouterr().err


def test_report_on_empty_snapshot(tmp_path):
    page = report.render_report(empty_store(tmp_path / "store"))
    for s in report.SECTIONS:
        body = section(page, s.key)
        if s.key != "counts":
            assert report.NONE_YET in body, s.key
    assert '<td>episodes</td><td class="num">0</td>' in section(page, "counts")
    assert "data:image/png" not in page


def test_report_llm_calls_per_stage_from_the_manifest(tmp_path):
    summary = {"llm_calls_by_stage": {"extract": 205, "resolve": 3},
               "llm_calls_per_episode": 1.015, "llm_retries": 2}
    llm = section(report.render_report(empty_store(tmp_path / "s", summary=summary)), "llm")
    assert '<td>extract</td><td class="num">205</td>' in llm
    assert '<td>resolve</td><td class="num">3</td>' in llm
    assert "calls per episode (extraction, resolution, invalidation): 1.01" in llm
    assert "retries: 2" in llm


def test_report_escapes_data():
    frame = report.Frame(["name"], [("<script>alert(1)</script>",)])
    assert "&lt;script&gt;" in report.table_html(frame)
    assert "<script>" not in report.table_html(frame)


def test_report_without_snapshot(tmp_path, capsys):
    assert main(["report", "--store", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 2
    assert "no published snapshot" in capsys.readouterr().err


def _bar_widths(img: str) -> list[int]:
    """The width in pixels of each bar of an inline chart, top to bottom."""
    import base64
    import io

    import numpy as np
    from matplotlib import image

    data = base64.b64decode(img.split("base64,", 1)[1].split('"', 1)[0])
    pixels = image.imread(io.BytesIO(data), format="png")[..., :3]
    bar = np.all(np.abs(pixels - np.array([0x4C, 0x72, 0xB0]) / 255) < 0.02, axis=2)
    rows = np.flatnonzero(bar.any(axis=1))
    bands = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1) if rows.size else []
    return [int(bar[band].sum(axis=1).max()) for band in bands]


def test_bar_chart_draws_its_values_in_order():
    """An inline PNG with one bar per label, the first label on top, lengths in proportion
    to the values; a chart of zeros draws no bar."""
    img = report.bar_chart(["first", "second"], [1.0, 2.5], "t")
    assert img.startswith('<img alt="chart" src="data:image/png;base64,iVBOR')
    first, second = _bar_widths(img)
    assert second / first == pytest.approx(2.5, rel=0.05)
    assert _bar_widths(report.bar_chart(["0"], [0.0], "t")) == []
