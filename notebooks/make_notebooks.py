"""Writes `analytics.ipynb` and `retrieval.ipynb` from the cell sources below.

The notebooks are committed without outputs; edit the cells here (reviewable Python) and run
`.venv/bin/python notebooks/make_notebooks.py`; `... make_notebooks.py --execute DIR` runs
them into DIR (with their outputs), leaving the committed files as they are.
`tests/test_notebooks.py` executes both against the sample corpus store and checks that the
committed files match this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

PARAMETERS = '''\
# Parameters: the store to open. The demo store (`make demo`) by default; the environment
# variable TKG_STORE (or editing this cell) points the notebook at any other store.
import os
from pathlib import Path

ROOT = Path.cwd() if (Path.cwd() / "pipeline").is_dir() else Path.cwd().parent
STORE = Path(os.environ.get("TKG_STORE") or ".tkg/demo")
STORE = STORE if STORE.is_absolute() else ROOT / STORE  # relative to the repository root
'''

SETUP = '''\
import json

import matplotlib.pyplot as plt
import polars as pl

from tkg.pipeline import store

con = store.connect(STORE)  # read-only DuckDB on the current snapshot's catalog
manifest = store.read_manifest(store.current_snapshot(STORE))
print(f"store {STORE}, snapshot {manifest['run_id']}, embedding {manifest['embedding']}")


def sql(query, *params):
    """A query's result as a polars DataFrame (parameters are bound, never formatted in)."""
    return con.sql(query, params=list(params) or None).pl()


def none_yet(frame, what):
    """Empty tables are normal (no communities before a refresh, no LLM on the embedded
    default): say so instead of drawing an empty chart."""
    if frame.height == 0:
        print(f"{what}: none yet")
        return True
    return False
'''

ANALYTICS = [
    ("md", """\
# tkg analytics

What a store holds and how it got there, all from SQL on the current snapshot's DuckDB
catalog: table sizes and growth per run, entities, one fact's history on both timelines,
invalidations, communities, LLM usage and time per stage, rejects. See
`notebooks/README.md` for how to open it, or run it head-less:
`TKG_STORE=.tkg/demo .venv/bin/jupyter execute --inplace notebooks/analytics.ipynb`.
"""),
    ("code", PARAMETERS),
    ("code", SETUP),
    ("md", "## Table sizes, and growth per run\n\nRows per view of the catalog now:"),
    ("code", '''\
views = [r[0] for r in con.execute(
    "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()]
sizes = sql(" UNION ALL ".join(
    f"SELECT '{v}' AS view, count(*) AS rows FROM {v}" for v in views))  # names from the catalog
sizes
'''),
    ("md", "Each run appends a row to `runs` with the counts it published:"),
    ("code", '''\
runs = sql("""
    SELECT run_id, status, started_at, episodes_in, episodes_ok, rejected, entities,
           facts, facts_current, facts_invalidated, communities
    FROM runs ORDER BY started_at""")
if not none_yet(runs, "runs"):
    fig, ax = plt.subplots(figsize=(7, 3))
    for column in ("episodes_ok", "entities", "facts_current"):
        ax.plot(runs["run_id"], runs[column].cum_sum() if column == "episodes_ok"
                else runs[column], marker="o", label=column)
    ax.set_title("growth per run (episodes cumulative)")
    ax.legend()
    plt.xticks(rotation=30)
    plt.show()
runs
'''),
    ("md", "## Entities by label, and the most mentioned"),
    ("code", '''\
labels = sql("""
    SELECT coalesce(label, '(none)') AS label, count(*) AS entities
    FROM (SELECT unnest(CASE WHEN len(labels) > 0 THEN labels ELSE [NULL] END) AS label
          FROM entities)
    GROUP BY ALL ORDER BY entities DESC, label""")
if not none_yet(labels, "entities"):
    fig, ax = plt.subplots(figsize=(7, 0.3 * labels.height + 1))
    ax.barh(labels["label"].to_list()[::-1], labels["entities"].to_list()[::-1])
    ax.set_title("entities by label")
    plt.show()
sql("""
    SELECT group_id, name, labels, mention_count, first_seen, last_seen
    FROM entities ORDER BY mention_count DESC, group_id, name LIMIT 15""")
'''),
    ("md", """\
## One fact's full history, on both timelines

Valid time (`valid_at` → `invalid_at`: when it held in the world) and transaction time
(`created_at` → `expired_at`: when the store believed it). By default the entity whose facts
were invalidated most often; set `ENTITY` to a name or alias to look at another one.
"""),
    ("code", '''\
ENTITY, GROUP = None, None
if ENTITY is None:  # the entity with the most facts among those with a fact invalidated
    pick = sql("""
        SELECT e.group_id, e.name
        FROM facts_current f JOIN entities e ON e.entity_id = f.source_entity_id
        GROUP BY e.group_id, e.name HAVING count(*) FILTER (f.invalid_at IS NOT NULL) > 0
        ORDER BY count(*) DESC, e.name LIMIT 1""")
    GROUP, ENTITY = (pick["group_id"][0], pick["name"][0]) if pick.height else (None, None)
history = None
if ENTITY:  # entity_history(alias, group): one group's; entity_history(alias): every group's
    history = (sql("SELECT * FROM entity_history(?, ?)", ENTITY, GROUP) if GROUP
               else sql("SELECT * FROM entity_history(?)", ENTITY))
print(f"history of {ENTITY}")
if history is not None and not none_yet(history, f"history of {ENTITY}"):
    from datetime import UTC, datetime

    now = datetime.now(UTC)  # open intervals run to now
    rows = history.to_dicts()
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.35 * len(rows) + 1.5), sharey=True)
    names = [f"{r['relation']} {r['object']} (v{r['version']})" for r in rows]
    for ax, (start, stop, title) in zip(axes, (("valid_at", "invalid_at", "valid time"),
                                               ("created_at", "expired_at", "transaction time"))):
        for i, r in enumerate(rows):
            if r[start] is None:
                ax.plot([now], [i], "x", color="grey")  # no valid time known
                continue
            closed = r[stop] is not None
            ax.plot([r[start], r[stop] or now], [i, i], lw=6, marker="|", markersize=10,
                    solid_capstyle="butt", color="tab:red" if closed else "tab:green")
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=30)
    axes[0].set_yticks(range(len(rows)), names)
    axes[0].invert_yaxis()
    fig.suptitle(f"{ENTITY}: green = open, red = closed, x = no valid time")
    plt.show()
history
'''),
    ("md", "## Facts invalidated per month (valid time of the change)"),
    ("code", '''\
invalidated = sql("""
    SELECT date_trunc('month', invalid_at) AS month, count(*) AS facts
    FROM facts_current WHERE invalid_at IS NOT NULL GROUP BY ALL ORDER BY month""")
if not none_yet(invalidated, "invalidated facts"):
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(invalidated["month"].to_list(), invalidated["facts"].to_list(), width=20)
    ax.set_title("facts invalidated per month")
    plt.show()
invalidated
'''),
    ("md", "## Communities: size distribution, and the largest with their summaries"),
    ("code", '''\
sizes = sql("SELECT size, count(*) AS communities FROM communities GROUP BY ALL ORDER BY size")
if not none_yet(sizes, "communities"):
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar([str(s) for s in sizes["size"]], sizes["communities"].to_list())
    ax.set_xlabel("members")
    ax.set_title("community sizes")
    plt.show()
sql("""
    SELECT c.group_id, c.name, c.size, c.summary,
           (SELECT string_agg(e.name, ', ' ORDER BY e.mention_count DESC)
            FROM community_members m JOIN entities e ON e.entity_id = m.entity_id
            WHERE m.community_id = c.community_id) AS members
    FROM communities c ORDER BY c.size DESC, c.group_id, c.name LIMIT 10""")
'''),
    ("md", """\
## LLM calls, tokens and seconds per stage per run

Seconds per stage come from every run; LLM figures appear once a run used an LLM (the
embedded default uses none). Columns of `runs` named `llm_*` that hold per-stage maps are
unpacked the same way as `stage_seconds`.
"""),
    ("code", '''\
seconds = sql("""
    SELECT run_id, e.key AS stage, e.value AS seconds
    FROM (SELECT run_id, started_at, unnest(map_entries(stage_seconds)) AS e FROM runs)
    ORDER BY started_at, stage""")
if not none_yet(seconds, "stage seconds"):
    wide = seconds.pivot(on="stage", index="run_id", values="seconds").fill_null(0)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bottom = [0.0] * wide.height
    for stage in wide.columns[1:]:
        ax.bar(wide["run_id"], wide[stage], bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, wide[stage])]
    ax.set_ylabel("seconds")
    ax.set_title("seconds per stage per run")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    plt.show()
columns = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE runs)").fetchall())
totals = [c for c in ("llm_calls", "llm_prompt_tokens", "llm_completion_tokens") if c in columns]
llm = sql("SELECT run_id, " + ", ".join(totals) + " FROM runs ORDER BY started_at")
per_stage = [c for c, kind in columns.items() if c.startswith("llm_") and kind.startswith("MAP")]
for column in per_stage:  # names come from the catalog's own columns
    print(column)
    display(sql(f"""SELECT run_id, e.key AS stage, e.value AS {column}
                   FROM (SELECT run_id, unnest(map_entries({column})) AS e FROM runs)
                   ORDER BY run_id, stage"""))
# LLM calls per stage are in each run's manifest (snapshots that `tkg gc` removed are gone).
manifests = [json.loads(p.read_text()) for p in sorted(STORE.glob("snapshots/*/manifest.json"))]
calls = pl.DataFrame(
    [{"run_id": m["run_id"], "stage": stage, "calls": n} for m in manifests
     for stage, n in ((m.get("summary") or {}).get("llm_calls_by_stage") or {}).items()],
    schema={"run_id": pl.String, "stage": pl.String, "calls": pl.Int64})
if not none_yet(calls, "LLM calls per stage"):
    display(calls.pivot(on="stage", index="run_id", values="calls").fill_null(0))
llm
'''),
    ("md", "## Rejects by reason"),
    ("code", '''\
rejects = sql("""
    SELECT run_id, stage, reason, count(*) AS records, any_value(file) AS example_file,
           min(line) AS first_line
    FROM rejects GROUP BY run_id, stage, reason ORDER BY records DESC, stage, reason""")
if not none_yet(rejects, "rejects"):
    fig, ax = plt.subplots(figsize=(7, 0.3 * rejects.height + 1))
    ax.barh([f"{s}: {r}"[:50] for s, r in zip(rejects["stage"], rejects["reason"])][::-1],
            rejects["records"].to_list()[::-1])
    ax.set_title("rejects by reason")
    plt.show()
rejects
'''),
]


RETRIEVAL_PARAMETERS = PARAMETERS + '''
# The question, its tenant, and two moments of valid time on either side of a change.
# The defaults fit the sample corpus (`make demo`); TKG_GROUP / TKG_QUESTION override them.
GROUP = os.environ.get("TKG_GROUP", "acme")
QUESTION = os.environ.get("TKG_QUESTION", "Where does Daniel Okafor live?")
BEFORE, AFTER = "2024-03-01T00:00:00Z", "2024-12-01T00:00:00Z"
'''

RETRIEVAL = [
    ("md", """\
# tkg retrieval

f(query) = constructor(rerank(search(query))) on a store's current snapshot, through the
Python API `tkg.query.open(store)`: the recipes side by side, the same question asked at two
points in valid time (`as_of`) and transaction time (`known_at`), and the context string an
agent gets. `tkg search` / `tkg context` print the same from the command line.
"""),
    ("code", RETRIEVAL_PARAMETERS),
    ("code", '''\
import time

import polars as pl

from tkg import query
from tkg.query.recipes import RECIPES

retriever = query.open(STORE)  # follows STORE/CURRENT: a new snapshot is picked up by itself
print(f"store {STORE}, snapshot {retriever.snapshot().run_id}")
pl.DataFrame([{"recipe": r.name, "description": r.description} for r in RECIPES.values()])
'''),
    ("md", """\
## Recipes side by side

Each recipe is data (which methods search which kinds, how they are fused); the top facts
each one returns for the question. The first call loads the embedding model.
"""),
    ("code", '''\
SIDE_BY_SIDE = ("combined_hybrid_rrf", "facts_hybrid_rrf", "facts_hybrid_mmr",
                "facts_episode_mentions", "combined_cross_encoder")
columns, timings = {}, {}
for name in SIDE_BY_SIDE:
    started = time.perf_counter()
    result = retriever.search(QUESTION, [GROUP], recipe=name, limit=5)
    timings[name] = round((time.perf_counter() - started) * 1000, 1)
    facts = [f.fact for f in result.facts] + [""] * 5
    columns[name] = facts[:5]
print("milliseconds per search:", timings)
pl.Config.set_fmt_str_lengths(60)
pl.DataFrame(columns).with_row_index("rank", offset=1)
'''),
    ("md", """\
## The same question at two moments of valid time (`as_of`)

What held in the world then, as the store believes now: facts whose valid range covers the
moment. A fact that a later one invalidated shows its end date.
"""),
    ("code", '''\
def show(result, label):
    print(label)
    for f in result.facts:
        print(f"  {f.fact}  ({f.valid_at or '?'} - {f.invalid_at or 'present'})")
    if not result.facts:
        print("  (no facts)")


for moment in (BEFORE, AFTER):
    show(retriever.search(QUESTION, [GROUP], as_of=moment, limit=5), f"as_of {moment}")
'''),
    ("md", """\
## The same question at two moments of transaction time (`known_at`)

What the store believed at a moment, whatever the world did: before the first build it knew
nothing; after each run it knew that run's versions. The moments are the store's own runs.
"""),
    ("code", '''\
from datetime import timedelta

from tkg.pipeline import store

with store.connect(STORE) as con:
    runs = con.sql("SELECT run_id, started_at, finished_at FROM runs ORDER BY started_at").pl()
moments = [("before the first run", runs["started_at"][0] - timedelta(seconds=1))] + [
    (f"after run {r['run_id']}", r["finished_at"]) for r in runs.to_dicts()]
for label, moment in moments:
    show(retriever.search(QUESTION, [GROUP], known_at=moment, limit=3),
         f"known_at {label} ({moment:%Y-%m-%d %H:%M:%S})")
'''),
    ("md", """\
## The context string an agent gets

Facts with their date ranges, entities with summaries, community summaries and the cited
episodes, within a token budget.
"""),
    ("code", '''\
context = retriever.context(QUESTION, [GROUP], max_tokens=1500)
print(context)
'''),
    ("md", """\
## Tenancy

A search is scoped to the groups it names, before ranking: the same question in another
group never sees this one's facts.
"""),
    ("code", '''\
others = [g for g in retriever.snapshot().groups if g != GROUP]
for other in others:
    result = retriever.search(QUESTION, [other], limit=5)
    show(result, f"group {other}")
'''),
]


def notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    made = []
    for kind, source in cells:
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        if source in (PARAMETERS, RETRIEVAL_PARAMETERS):
            cell.metadata["tags"] = ["parameters"]
        made.append(cell)
    nb = new_notebook(cells=made)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (tkg .venv)",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def render(cells: list[tuple[str, str]]) -> str:
    """The notebook file's text; cell ids are derived from positions so it is reproducible."""
    nb = notebook(cells)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nbformat.writes(nb) + "\n"


NOTEBOOKS = {"analytics.ipynb": ANALYTICS, "retrieval.ipynb": RETRIEVAL}


def execute(name: str, out_dir: Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Run a committed notebook head-less (against $TKG_STORE or the demo store) and write
    the executed copy, outputs and all, into `out_dir`: the committed file stays as this
    script writes it (`jupyter execute --inplace` rewrote it, and a test failed)."""
    import nbclient

    nb = nbformat.read(HERE / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(HERE)}}).execute()
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / name)
    return nb


def main(argv: list[str]) -> int:
    """No argument: write the notebooks from the cells. `--execute DIR`: run them into DIR."""
    if argv[:1] == ["--execute"] and len(argv) == 2:
        for name in NOTEBOOKS:
            execute(name, Path(argv[1]))
            print(f"ran {name} into {Path(argv[1]) / name}")
        return 0
    if argv:
        print("usage: make_notebooks.py [--execute OUT_DIR]", file=sys.stderr)
        return 2
    for name, cells in NOTEBOOKS.items():
        (HERE / name).write_text(render(cells))
        print(f"wrote {HERE / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
