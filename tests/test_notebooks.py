"""The notebooks run: each is executed head-less (nbclient, one kernel per notebook) against
the session's sample-corpus store and fails on any cell error. The committed .ipynb files
must match `notebooks/make_notebooks.py`, where their cells are written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT = 300  # seconds per cell: the first search loads the embedding model


def maker():
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def execute(name: str, store: Path, monkeypatch, out: Path) -> nbformat.NotebookNode:
    """As README's `make_notebooks.py --execute DIR` runs it: the executed copy in `out`, the
    committed notebook untouched (raises CellExecutionError, with the cell and traceback, on
    any error)."""
    monkeypatch.setenv("TKG_STORE", str(store))
    committed = (NOTEBOOKS / name).read_text()
    nb = maker().execute(name, out, timeout=TIMEOUT)
    assert (NOTEBOOKS / name).read_text() == committed
    assert nbformat.read(out / name, as_version=4).cells[-1].cell_type  # written, readable
    return nb


def outputs(nb, kind: str) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
            if kind in o.get("data", {}) or o.get("output_type") == kind]


def text_of(nb) -> str:
    return "\n".join(o.get("text", "") for o in outputs(nb, "stream"))


@pytest.mark.parametrize("name", sorted(maker().NOTEBOOKS))
def test_committed_notebooks_match_their_source(name):
    assert (NOTEBOOKS / name).read_text() == maker().render(maker().NOTEBOOKS[name]), (
        f"notebooks/{name} differs from make_notebooks.py: run "
        "`.venv/bin/python notebooks/make_notebooks.py` and commit both")


def test_analytics_notebook_runs(corpus_build, corpus_db, monkeypatch, tmp_path):
    store = corpus_build.snapshot.parent.parent
    nb = execute("analytics.ipynb", store, monkeypatch, tmp_path)
    printed = text_of(nb)
    assert f"snapshot {corpus_build.summary['run_id']}" in printed
    # growth, labels, one fact's history, invalidations per month, seconds per stage
    assert len(outputs(nb, "image/png")) >= 5
    communities = corpus_db.execute("SELECT count(*) FROM communities").fetchone()[0]
    assert ("communities: none yet" in printed) == (communities == 0)
    rejects = corpus_db.execute("SELECT count(*) FROM rejects").fetchone()[0]
    assert ("rejects: none yet" in printed) == (rejects == 0)
    # the history plot is of the subject with the most facts among those with one invalidated
    subject = corpus_db.execute("""
        SELECT e.name FROM facts_current f JOIN entities e ON e.entity_id = f.source_entity_id
        GROUP BY e.group_id, e.name HAVING count(*) FILTER (f.invalid_at IS NOT NULL) > 0
        ORDER BY count(*) DESC, e.name LIMIT 1""").fetchall()[0][0]
    assert f"history of {subject}" in printed


def blocks(printed: str) -> dict[str, str]:
    """The notebook's printed answers, keyed by their heading line (`as_of ...`)."""
    out, key = {}, None
    for line in printed.splitlines():
        if line and not line.startswith(" "):
            key = line
            out[key] = ""
        elif key is not None:
            out[key] += line + "\n"
    return out


def test_retrieval_notebook_runs(corpus_build, monkeypatch, tmp_path):
    """On the sample corpus: Daniel Okafor lived in Berlin, then moved to Paris (June 2024)."""
    store = corpus_build.snapshot.parent.parent
    nb = execute("retrieval.ipynb", store, monkeypatch, tmp_path)
    printed = text_of(nb)
    answers = blocks(printed)
    before = answers["as_of 2024-03-01T00:00:00Z"]
    after = answers["as_of 2024-12-01T00:00:00Z"]
    assert "Berlin" in before and "Paris" not in before
    assert "lives in Paris" in after and "Berlin" not in after
    known = [v for k, v in answers.items() if k.startswith("known_at before the first run")]
    assert known == ["  (no facts)\n"]
    assert any(k.startswith("known_at after run corpus-1") and "Daniel Okafor" in v
               for k, v in answers.items())
    context = printed[printed.index("FACTS, ENTITIES"):]  # the context string an agent gets
    assert "<FACTS>" in context and "<EPISODES>" in context, context[:3000]
    assert "Daniel Okafor" in context
    household = answers["group household"]
    assert household and "Okafor" not in household  # tenancy: nothing from acme
    assert "milliseconds per search" in printed
