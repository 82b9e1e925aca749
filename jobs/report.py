"""`tkg report --store DIR [--out FILE.html]`: one self-contained HTML page about a snapshot's run.

Everything comes from SQL on the current snapshot's DuckDB catalog (plus its manifest for the
title); charts are matplotlib PNGs inlined as base64, so the file can be mailed or attached
to a ticket. Every section renders, with "none yet" when its table is empty. All text from
the data is HTML-escaped: episodes are user input. Without `--out` the page is written
beside the store (`.tkg/demo` -> `.tkg/demo-report.html`), never into the working dir, which
`ray job submit --working-dir .` would ship.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

NONE_YET = "none yet"
TOP = 15  # rows in "top" tables and bars in charts
SUMMARY_CHARS = 300


@dataclass(frozen=True)
class Frame:
    """A query result: column names and rows (the report needs nothing heavier)."""

    columns: list[str]
    rows: list[tuple]


def query(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> Frame:
    cursor = con.execute(sql, list(params))
    return Frame([d[0] for d in cursor.description], cursor.fetchall())


def columns_of(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """Column name -> DuckDB type, so the report copes with columns other issues add."""
    return {row[0]: row[1] for row in con.execute(f"DESCRIBE {table}").fetchall()}


# --- rendering ---------------------------------------------------------------------------

def esc(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return html.escape(value.strftime("%Y-%m-%d %H:%M:%S %Z").strip())
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))


def table_html(frame: Frame, empty: str = NONE_YET) -> str:
    if not frame.rows:
        return f'<p class="none">{empty}</p>'
    head = "".join(f"<th>{esc(c)}</th>" for c in frame.columns)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{esc(v)}</td>' if isinstance(v, int | float) and not
            isinstance(v, bool) else f"<td>{esc(v)}</td>" for v in row) + "</tr>"
        for row in frame.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def png(figure: Any) -> str:
    """A matplotlib figure as an inline <img> (base64 PNG); the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def bar_chart(labels: Sequence[Any], values: Sequence[float], title: str,
              xlabel: str = "", horizontal: bool = True) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(x) for x in labels]
    figure, axis = plt.subplots(figsize=(6.4, 0.3 * len(labels) + 1.2 if horizontal else 3.2))
    if horizontal:
        axis.barh(labels[::-1], list(values)[::-1], color="#4c72b0")
        axis.set_xlabel(xlabel)
    else:
        axis.bar(labels, values, color="#4c72b0")
        axis.set_ylabel(xlabel)
        axis.tick_params(axis="x", labelrotation=45)
    axis.set_title(title)
    return png(figure)


# --- sections ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    con: duckdb.DuckDBPyConnection
    run_id: str
    manifest: dict[str, Any]


def section_counts(ctx: Context) -> str:
    totals = query(ctx.con, """
        SELECT 'episodes' AS "table", count(*) AS rows FROM episodes
        UNION ALL SELECT 'entities', count(*) FROM entities
        UNION ALL SELECT 'entity_aliases', count(*) FROM entity_aliases
        UNION ALL SELECT 'mentions', count(*) FROM mentions
        UNION ALL SELECT 'facts (edges)', count(DISTINCT edge_id) FROM facts
        UNION ALL SELECT 'fact versions', count(*) FROM facts
        UNION ALL SELECT 'facts_current', count(*) FROM facts_current
        UNION ALL SELECT 'facts invalidated (current)', count(*) FROM facts_current
                  WHERE invalid_at IS NOT NULL
        UNION ALL SELECT 'communities', count(*) FROM communities
        UNION ALL SELECT 'community_members', count(*) FROM community_members
        UNION ALL SELECT 'rejects', count(*) FROM rejects
        UNION ALL SELECT 'runs', count(*) FROM runs""")
    groups = query(ctx.con, """
        WITH g AS (SELECT DISTINCT group_id FROM episodes)
        SELECT g.group_id,
               (SELECT count(*) FROM episodes e WHERE e.group_id = g.group_id) AS episodes,
               (SELECT count(*) FROM entities n WHERE n.group_id = g.group_id) AS entities,
               (SELECT count(*) FROM facts_current f WHERE f.group_id = g.group_id)
                   AS facts_current,
               (SELECT count(*) FROM communities c WHERE c.group_id = g.group_id)
                   AS communities
        FROM g ORDER BY g.group_id""")
    return table_html(totals) + "<h3>per group</h3>" + table_html(groups)


def section_runs(ctx: Context) -> str:
    """One narrow row per run (twelve columns of full timestamps ran off the page): counts
    that belong together share a cell."""
    runs = query(ctx.con, """
        SELECT run_id || ' (' || status || ')' AS run,
               strftime(started_at, '%Y-%m-%d %H:%M') AS started,
               round(list_sum(map_values(stage_seconds)), 1) AS seconds,
               format('{:,} / {:,} / {:,}', episodes_in, episodes_ok, rejected)
                   AS "records in / ok / rejected",
               entities,
               format('{:,} / {:,}', facts_current, facts_invalidated)
                   AS "facts current / invalidated",
               communities
        FROM runs ORDER BY started_at""")
    chart = ""
    if len(runs.rows) > 1:
        chart = bar_chart([r[0].split(" ")[0] for r in runs.rows],
                          [r[4] or 0 for r in runs.rows],
                          "entities after each run", "entities", horizontal=False)
    return table_html(runs) + chart


def section_stages(ctx: Context) -> str:
    stages = query(ctx.con, """
        SELECT e.key AS stage, round(e.value, 3) AS seconds
        FROM (SELECT unnest(map_entries(stage_seconds)) AS e FROM runs WHERE run_id = ?)
        ORDER BY seconds DESC""", [ctx.run_id])
    if not stages.rows:
        return table_html(stages)
    total = sum(r[1] or 0 for r in stages.rows)
    chart = bar_chart([r[0] for r in stages.rows], [r[1] or 0 for r in stages.rows],
                      f"seconds per stage (total {total:.1f} s)", "seconds")
    return table_html(stages) + chart


def section_llm(ctx: Context) -> str:
    """Totals per run, and per stage where the runs table has per-stage maps (`llm_*` MAPs)."""
    cols = columns_of(ctx.con, "runs")
    totals = [c for c in ("llm_calls", "llm_prompt_tokens", "llm_completion_tokens")
              if c in cols]
    per_run = query(ctx.con, "SELECT run_id, " + ", ".join(
        f"coalesce({c}, 0) AS {c}" for c in totals) + " FROM runs ORDER BY started_at")
    used = [r for r in per_run.rows if any(v for v in r[1:])]
    out = table_html(Frame(per_run.columns, used),
                     empty=f"{NONE_YET}: no run of this store made LLM calls "
                           "(the embedded default uses none)")
    maps = [c for c, kind in cols.items() if c.startswith("llm_") and kind.startswith("MAP")]
    if maps and used:
        unions = " UNION ALL ".join(
            f"SELECT run_id, '{c}' AS measure, e.key AS stage, e.value AS value FROM "
            f"(SELECT run_id, unnest(map_entries({c})) AS e FROM runs)" for c in maps)
        per_stage = query(ctx.con, f"""
            PIVOT ({unions}) ON measure USING sum(value) ORDER BY run_id, stage""")
        out += "<h3>per stage</h3>" + table_html(per_stage)
    summary = ctx.manifest.get("summary") or {}
    by_stage = summary.get("llm_calls_by_stage") or {}
    if by_stage:  # this run's calls per stage are in its manifest, not (yet) in `runs`
        out += (f"<h3>calls per stage, run {esc(ctx.run_id)}</h3>"
                + table_html(Frame(["stage", "calls"], sorted(by_stage.items())))
                + f"<p>calls per episode (extraction, resolution, invalidation): "
                  f"{esc(summary.get('llm_calls_per_episode'))}; retries: "
                  f"{esc(summary.get('llm_retries', 0))}</p>")
    return out


def section_rejects(ctx: Context) -> str:
    reasons = query(ctx.con, """
        SELECT stage, reason, count(*) AS records
        FROM rejects GROUP BY ALL ORDER BY records DESC, stage, reason""")
    chart = ""
    if reasons.rows:
        top = reasons.rows[:TOP]
        chart = bar_chart([f"{r[0]}: {r[1]}"[:60] for r in top], [r[2] for r in top],
                          "rejects by reason", "records")
    return table_html(reasons) + chart


def section_entities(ctx: Context) -> str:
    labels = query(ctx.con, """
        SELECT coalesce(label, '(none)') AS label, count(*) AS entities
        FROM (SELECT unnest(CASE WHEN len(labels) > 0 THEN labels ELSE [NULL] END) AS label
              FROM entities)
        GROUP BY ALL ORDER BY entities DESC, label""")
    top = query(ctx.con, f"""
        SELECT group_id, name, array_to_string(labels, ', ') AS labels, mention_count
        FROM entities ORDER BY mention_count DESC, group_id, name LIMIT {TOP}""")
    chart = ""
    if labels.rows:
        rows = labels.rows[:TOP]
        chart = bar_chart([r[0] for r in rows], [r[1] for r in rows], "entities by label",
                          "entities")
    return (table_html(labels) + chart + "<h3>most mentioned</h3>" + table_html(top))


def section_facts(ctx: Context) -> str:
    relations = query(ctx.con, f"""
        SELECT relation, count(*) AS current_facts,
               count(*) FILTER (invalid_at IS NOT NULL) AS invalidated
        FROM facts_current GROUP BY ALL ORDER BY current_facts DESC, relation LIMIT {TOP}""")
    months = query(ctx.con, """
        SELECT strftime(date_trunc('month', invalid_at), '%Y-%m') AS month,
               count(*) AS invalidated
        FROM facts_current WHERE invalid_at IS NOT NULL GROUP BY ALL ORDER BY month""")
    chart = ""
    if months.rows:
        chart = bar_chart([r[0] for r in months.rows], [r[1] for r in months.rows],
                          "facts invalidated per month (valid time)", "facts",
                          horizontal=False)
    return (table_html(relations) + "<h3>invalidated per month</h3>"
            + table_html(months) + chart)


def section_communities(ctx: Context) -> str:
    """The largest communities by members, as a table and bars; with more than TOP, how
    sizes spread (a bar per distinct size drew seven bars of height 1 on the demo)."""
    top = query(ctx.con, f"""
        SELECT group_id, name, size, summary FROM communities
        ORDER BY size DESC, group_id, name LIMIT {TOP}""")
    chart = ""
    if top.rows:
        chart = bar_chart([f"{r[1] or '(unnamed)'} ({r[0]})"[:50] for r in top.rows],
                          [r[2] for r in top.rows], f"the {len(top.rows)} largest communities",
                          "members")
    total = query(ctx.con, "SELECT count(*) FROM communities").rows[0][0]
    if total > TOP:
        sizes = query(ctx.con, """
            SELECT CASE WHEN size <= 2 THEN size::VARCHAR
                        ELSE (2 ** floor(log2(size - 1)))::BIGINT + 1 || '-'
                             || (2 ** ceil(log2(size)))::BIGINT END AS members,
                   min(size) AS low, count(*) AS communities
            FROM communities GROUP BY ALL ORDER BY low""")
        chart += bar_chart([r[0] for r in sizes.rows], [r[2] for r in sizes.rows],
                           f"community sizes ({total:,} communities)", "communities",
                           horizontal=False)
    top = Frame(top.columns, [(*r[:3], _clip(r[3])) for r in top.rows])
    return table_html(top) + chart


NEIGHBOURS = 12  # entities drawn around the busiest one in the graph picture
FACT_LINES = 2  # facts written under a neighbour's name


def section_graph(ctx: Context) -> str:
    """A picture of the graph: the entity with the most facts and the entities its facts
    reach, placed clockwise by when their first fact began; under each name its facts
    (relation, valid time), dashed where every one of them has ended."""
    hub = query(ctx.con, """
        SELECT e.entity_id, e.group_id, e.name, count(*) AS facts
        FROM facts_current f JOIN entities e ON e.group_id = f.group_id
             AND e.entity_id IN (f.source_entity_id, f.target_entity_id)
        WHERE f.source_entity_id <> f.target_entity_id
        GROUP BY ALL ORDER BY facts DESC, e.group_id, e.name LIMIT 1""")
    if not hub.rows:
        return f'<p class="none">{NONE_YET}</p>'
    entity_id, group, name, _ = hub.rows[0]
    around = query(ctx.con, """
        WITH touching AS (
            SELECT CASE WHEN f.source_entity_id = $1 THEN f.target_entity_id
                        ELSE f.source_entity_id END AS other_id,
                   f.relation, f.source_entity_id = $1 AS outgoing, f.valid_at, f.invalid_at
            FROM facts_current f
            WHERE f.group_id = $2 AND $1 IN (f.source_entity_id, f.target_entity_id)
              AND f.source_entity_id <> f.target_entity_id)
        SELECT coalesce(e.name, '?') AS other, min(t.valid_at) AS first,
               list(CASE WHEN t.outgoing THEN '' ELSE '<- ' END || t.relation || ' '
                    || coalesce(strftime(t.valid_at, '%Y-%m-%d'), '?')
                    || coalesce(' .. ' || strftime(t.invalid_at, '%Y-%m-%d'), '')
                    ORDER BY t.valid_at NULLS FIRST, t.relation) AS facts,
               bool_and(t.invalid_at IS NOT NULL) AS ended
        FROM touching t LEFT JOIN entities e ON e.entity_id = t.other_id AND e.group_id = $2
        GROUP BY t.other_id, e.name ORDER BY first NULLS FIRST, other""",
                   [entity_id, group])
    rows = around.rows[:NEIGHBOURS]
    shown = (f"the first {len(rows)} of the {len(around.rows)} entities its facts reach"
             if len(around.rows) > len(rows) else f"the {len(rows)} entities its facts reach")
    return (f"<p>{esc(name)} (group {esc(group)}) and {shown}, clockwise from the top in the "
            "order their first fact began; dashed: every fact with it has ended.</p>"
            + neighbourhood_chart(name, rows))


def neighbourhood_chart(name: str, rows: Sequence[tuple]) -> str:
    """The entity in the middle, one spoke per neighbour with its facts under its name."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 8))
    axis.set_axis_off()
    axis.set_xlim(-1.8, 1.8)
    axis.set_ylim(-1.2, 1.2)
    for i, (other, _, facts, ended) in enumerate(rows):
        angle = math.pi / 2 - 2 * math.pi * i / max(len(rows), 1)
        ring = 1.0 if i % 2 == 0 else 0.7  # neighbours alternate rings: labels apart
        x, y = 1.35 * ring * math.cos(angle), ring * math.sin(angle)
        axis.plot([0, x], [0, y], color="#aaa" if ended else "#4c72b0",
                  linestyle="--" if ended else "-", linewidth=1, zorder=1)
        lines = [str(other)[:30]] + [f[:38] for f in facts[:FACT_LINES]] + (
            [f"+{len(facts) - FACT_LINES} more"] if len(facts) > FACT_LINES else [])
        axis.text(x, y, "\n".join(lines), fontsize=7, ha="center", va="center", zorder=2,
                  bbox={"boxstyle": "round", "fc": "#f4f4f4" if ended else "#eef",
                        "ec": "#bbb" if ended else "#99b"})
    axis.text(0, 0, str(name)[:30], fontsize=10, weight="bold", ha="center", va="center",
              zorder=3, bbox={"boxstyle": "round", "fc": "#fde", "ec": "#c69"})
    return png(figure)


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= SUMMARY_CHARS:
        return text
    return text[: SUMMARY_CHARS - 1] + "…"


@dataclass(frozen=True)
class ReportSection:
    key: str  # the HTML id; the tests assert every one is present
    title: str
    render: Callable[[Context], str]


SECTIONS = (
    ReportSection("counts", "Counts", section_counts),
    ReportSection("runs", "Runs", section_runs),
    ReportSection("stages", "Seconds per stage", section_stages),
    ReportSection("llm", "LLM usage", section_llm),
    ReportSection("rejects", "Rejects by reason", section_rejects),
    ReportSection("entities", "Entities", section_entities),
    ReportSection("facts", "Facts and invalidations", section_facts),
    ReportSection("communities", "Top communities", section_communities),
    ReportSection("graph", "The graph around its busiest entity", section_graph),
)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; max-width: 100%; }
td { overflow-wrap: anywhere; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.none { color: #888; font-style: italic; } img { max-width: 100%; display: block; }
section { border-top: 1px solid #eee; padding-top: 0.5em; }
"""


def render_report(store_dir: str | Path) -> str:
    """The page for the current snapshot of `store_dir`."""
    from tkg.pipeline import storage, store

    store_dir = storage.location(store_dir)
    snapshot = store.current_snapshot(store_dir)
    manifest = store.read_manifest(snapshot)
    run_id = manifest["run_id"]
    embedding = manifest.get("embedding", {})
    with store.connect(store_dir) as con:
        ctx = Context(con, run_id, manifest)
        body = "".join(
            f'<section id="{s.key}"><h2>{esc(s.title)}</h2>{s.render(ctx)}</section>'
            for s in SECTIONS)
    meta = (f"store {esc(store_dir)} · snapshot {esc(run_id)} · created "
            f"{esc(manifest.get('created_at'))} · config {esc(manifest.get('config_hash'))} · "
            f"embedding {esc(embedding.get('model'))} ({esc(embedding.get('dim'))}-d)")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>tkg report {esc(run_id)}</title><style>{STYLE}</style></head><body>"
            f"<h1>tkg report</h1><p class=\"meta\">{meta}</p>{body}</body></html>\n")


def default_out(store_dir: str | Path) -> Path:
    """Beside a local store: `.tkg/demo` -> `.tkg/demo-report.html`."""
    from tkg.pipeline import storage

    if storage.is_url(store_dir):
        raise ValueError(f"{store_dir} is in object storage: name the page to write with "
                         "--out FILE.html")
    store = Path(store_dir).resolve()
    return store.with_name(f"{store.name}-report.html")


def write_report(store_dir: str | Path, out: str | Path | None = None) -> Path:
    out = Path(out) if out is not None else default_out(store_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(store_dir), encoding="utf-8")
    return out


def cmd_report(args: Any) -> int:
    out = write_report(args.store, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def add_command(commands: Any) -> None:
    """`tkg report --store DIR [--out FILE.html]`, registered by `jobs/cli.py`."""
    report = commands.add_parser("report", help="one-page HTML report of the current snapshot")
    report.add_argument("--store", required=True, help="store folder")
    report.add_argument("--out", default=None,
                        help="HTML file to write (default: beside the store, "
                             "STORE-report.html)")
    report.set_defaults(fn=cmd_report)
