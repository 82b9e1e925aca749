"""`tkg bench graph`: how good the graph itself is on real data (../shared/data) and the
sample corpus, built once with the configured extractor (the embedded default: spaCy, no
LLM). Figures only, never a gate. Parts (`--only`):

- `locomo`: LoCoMo's gold `observation` facts (2,541 facts a person would write down, each
  with its evidence turn ids). *Coverage*: the share of them with any fact drawn from an
  evidence turn (a published fact whose `episode_ids` hold the turn); *recall@c*: the share
  whose best such fact is close in meaning, MiniLM cosine >= c (0.7, and 0.6). Overall, per
  conversation, and by whose turn the evidence is (the observation's own person speaking,
  or the other one telling about them). `extracted` scores the facts of each turn's
  extraction instead (before edges merge and pick one wording per edge).
- `chinook`: customers, employees and invoices as records (jobs/bench/chinook.py, the
  mapping the records test checks too): record entities per label against the fixture's
  counts, entities named by a record's attribute value (a phone, a first name: should be
  none), and reference edges (REPORTS_TO, SUPPORT_REP, an invoice's CUSTOMER) recall and
  precision against the fixture's own keys.
- `corpus` (tests/corpus), `podcast` (the transcript) and `locomo`: the share of entities
  that are *generic nouns* and the *person-name duplicates* left (below).

A generic-noun entity is one whose name is only common words: no digit, every word in lower
case, and no token spaCy's tagger (the configured model) calls a proper noun when the name
is read in a plain sentence ("They talked about news."). "news", "new job", "kids & work"
are; "Covid", "T-23", "Riverside Elementary", "iPhone" are not. A capital is taken as a
name's mark, because spaCy's small model tags a lone capitalized word (Caroline, Contoso) a
common noun as often as not: a generic noun named from a sentence start ("Painting") is
missed, so the share is a lower bound.
A person-name duplicate is a person's name that is one word of exactly one other person's
name in its group ("Tetlow" beside "Tania Tetlow" only): the short form a reader would
resolve (`resolve.person_name_duplicates`). Both are linguistic measures, with no word list
from the data.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tkg.jobs.bench import chinook, locomo
from tkg.jobs.bench.figures import SHARED_DATA, report

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
PARTS = ("locomo", "chinook", "corpus", "podcast")
THRESHOLDS = (0.7, 0.6)
PODCAST_GROUP = "podcast"
PODCAST_START = datetime(2024, 1, 1, tzinfo=UTC)
TURN = re.compile(r"^(\d+) \((?:(\d+)m ?)?(\d+)s\):\s*$")
EXAMPLES = 12
CARRIER = "They talked about "


# --- inputs -----------------------------------------------------------------------------

def podcast_episodes(path: Path) -> list[dict]:
    """The transcript's turns (`SPEAKER_INDEX (offset):` then the text) as messages of one
    conversation, stamped with their offset."""
    turns: list[dict] = []
    for line in path.read_text().splitlines():
        match = TURN.match(line)
        if match:
            speaker, minutes, seconds = match.groups()
            stamp = PODCAST_START + timedelta(minutes=int(minutes or 0), seconds=int(seconds))
            turns.append({"group_id": PODCAST_GROUP, "id": f"podcast-{len(turns)}",
                          "kind": "message", "conversation_id": "podcast",
                          "speaker": f"Speaker {speaker}", "role": "user",
                          "timestamp": stamp.isoformat().replace("+00:00", "Z"),
                          "content": ""})
        elif turns and line.strip():
            turns[-1]["content"] = f"{turns[-1]['content']} {line.strip()}".strip()
    return [t for t in turns if t["content"]]


def locomo_samples(path: Path, conversations: int | None, sessions: int | None
                   ) -> list[dict[str, Any]]:
    """The first `conversations` samples, each cut to its first `sessions` sessions (with
    their observations) for a quick subset."""
    data = json.loads(path.read_text())[:conversations]
    if sessions is None:
        return data
    for sample in data:
        for key in list(sample["conversation"]):
            number = re.match(r"^session_(\d+)", key)
            if number and int(number.group(1)) > sessions:
                del sample["conversation"][key]
        sample["observation"] = {k: v for k, v in sample["observation"].items()
                                 if int(re.findall(r"\d+", k)[0]) <= sessions}
    return data


def observations(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LoCoMo's gold observations: group, person, text and evidence turn ids."""
    rows = []
    for sample in data:
        group = re.sub(r"[^A-Za-z0-9_-]", "-", sample["sample_id"])
        for session in sample.get("observation", {}).values():
            for person, facts in session.items():
                for text, evidence in facts:
                    ids = locomo.evidence_ids([evidence] if isinstance(evidence, str)
                                              else list(evidence))
                    rows.append({"group_id": group, "person": person, "text": text,
                                 "evidence": ids})
    return rows


def write_jsonl(records: Iterable[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return path


def corpus_groups(folder: Path) -> list[str]:
    return sorted({json.loads(line)["group_id"] for path in sorted(folder.glob("*.jsonl"))
                   for line in path.read_text().splitlines() if line.strip()})


# --- measures ---------------------------------------------------------------------------

def generic_flags(names: list[str], nlp: Any) -> list[bool]:
    """Whether each name is a generic noun (the module's definition)."""
    flags = []
    carried = (f"{CARRIER}{name}." for name in names)
    for name, doc in zip(names, nlp.pipe(carried), strict=True):
        tokens = doc[len(CARRIER.split()):-1]
        flags.append(any(t.is_alpha for t in tokens) and not any(c.isdigit() for c in name)
                     and name == name.lower() and not any(t.pos_ == "PROPN" for t in tokens))
    return flags


def generic_share(con: Any, groups: list[str], nlp: Any) -> dict[str, Any]:
    names = [name for (name,) in con.execute(
        "SELECT name FROM entities WHERE list_contains(?, group_id) ORDER BY name",
        [groups]).fetchall()]
    flags = generic_flags(names, nlp)
    generic = [n for n, flag in zip(names, flags, strict=True) if flag]
    return {"entities": len(names), "generic": len(generic),
            "share": round(len(generic) / len(names), 4) if names else None,
            "examples": generic[:EXAMPLES]}


def person_duplicates(con: Any, groups: list[str]) -> dict[str, Any]:
    """`resolve.person_name_duplicates` (the one definition) over the groups' entities."""
    import pyarrow as pa
    from tkg.pipeline import resolve

    rows = con.execute("SELECT group_id, name, labels FROM entities WHERE "
                       "list_contains(?, group_id) ORDER BY group_id, name", [groups]).fetchall()
    entities = pa.table({column: [row[i] for row in rows] for i, column in
                         enumerate(("group_id", "name", "labels"))})
    persons = sum(bool(set(labels or ()) & resolve.PERSONISH)
                  for labels in entities["labels"].to_pylist())
    found = [f"{name} ~ {full}" + (f" ({group})" if len(groups) > 1 else "")
             for group, name, full in resolve.person_name_duplicates(entities)]
    return {"person_names": persons, "duplicates": len(found),
            "share": round(len(found) / persons, 4) if persons else None,
            "examples": found[:EXAMPLES]}


def observation_recall(con: Any, snapshot: Any, gold: list[dict[str, Any]], embed: Any
                       ) -> dict[str, Any]:
    """Coverage and recall@c of the gold observations, from published facts and from each
    turn's extracted facts (`_extractions`, internal: not a catalog view)."""
    from tkg.pipeline import schema, store

    con.register("graph_extractions", store.read_table(
        snapshot, "_extractions", schema.EXTRACTIONS, ["group_id", "episode_id", "facts"]))
    groups = sorted({g["group_id"] for g in gold})
    speakers = dict(((g, s), p) for g, s, p in con.execute(
        "SELECT group_id, source_id, speaker FROM episodes WHERE list_contains(?, group_id)",
        [groups]).fetchall())
    published = _turn_facts(con.execute(
        "SELECT DISTINCT e.group_id, e.source_id, f.fact FROM (SELECT group_id, fact, "
        "unnest(episode_ids) AS episode_id FROM facts) f JOIN episodes e USING "
        "(group_id, episode_id) WHERE list_contains(?, e.group_id)", [groups]).fetchall())
    extracted = _turn_facts(con.execute(
        "SELECT DISTINCT e.group_id, e.source_id, x.fact.fact FROM (SELECT group_id, "
        "episode_id, unnest(facts) AS fact FROM graph_extractions) x JOIN episodes e USING "
        "(group_id, episode_id) WHERE list_contains(?, e.group_id)", [groups]).fetchall())
    figures = _scores(gold, published, speakers, embed)
    figures["extracted"] = _scores(gold, extracted, speakers, embed)["overall"]
    return figures


def _turn_facts(rows: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for group_id, source_id, fact in rows:
        if fact:
            found[(group_id, source_id)].append(fact)
    return found


def _scores(gold: list[dict[str, Any]], turn_facts: dict[tuple[str, str], list[str]],
            speakers: dict[tuple[str, str], str], embed: Any) -> dict[str, Any]:
    import numpy as np

    texts = sorted({f for facts in turn_facts.values() for f in facts}
                   | {g["text"] for g in gold})
    vectors = dict(zip(texts, embed(texts), strict=True))
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for g in gold:
        keys = [(g["group_id"], turn) for turn in g["evidence"]]
        facts = [f for key in keys for f in turn_facts.get(key, ())]
        best = max((float(np.dot(vectors[g["text"]], vectors[f])) for f in facts),
                   default=0.0)
        row = {"coverage": float(bool(facts)),
               **{f"recall@{c}": float(best >= c) for c in THRESHOLDS}}
        own = any(speakers.get(key) == g["person"] for key in keys)
        for category in ("overall", f"conversation {g['group_id']}",
                         f"turn {'own' if own else 'other'}"):
            rows[category].append(row)
    return {name: {"observations": len(found), **{m: round(
        sum(r[m] for r in found) / len(found), 4) for m in found[0]}}
            for name, found in rows.items()}


# --- the bench --------------------------------------------------------------------------

def bench_graph(parts: Iterable[str] = PARTS, data_dir: Path = SHARED_DATA,
                config: Any = None, config_path: str | None = None,
                workdir: str | None = None, conversations: int | None = None,
                sessions: int | None = None, store: str | None = None) -> dict[str, Any]:
    """Convert the chosen parts' inputs, build them into one store (each in groups of its
    own; or score `store`, built from the same parts), and measure."""
    from tkg.pipeline import storage
    from tkg.pipeline import store as stores
    from tkg.pipeline.build import build
    from tkg.pipeline.config import EmbedConfig, load_config
    from tkg.pipeline.embed import shared_embedder
    from tkg.pipeline.extract.spacy_extractor import load_spacy

    parts = [p for p in PARTS if p in set(parts)]
    config = chinook.records_config(config or load_config(config_path))
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tkg-graph-"))
    inputs: list[str] = []
    groups: dict[str, list[str]] = {}
    gold: list[dict[str, Any]] = []
    records: list[dict] = []
    if "locomo" in parts:
        data = locomo_samples(_needed(data_dir / "locomo10.json"), conversations, sessions)
        path, _ = locomo.convert(data, base / "locomo")
        inputs.append(str(path))
        gold = observations(data)
        groups["locomo"] = sorted({g["group_id"] for g in gold})
    if "chinook" in parts:
        records = chinook.to_episodes(_needed(data_dir / "chinook_fixture.json"))
        inputs.append(str(write_jsonl(records, base / "chinook" / "chinook.jsonl")))
        groups["chinook"] = [chinook.GROUP]
    if "corpus" in parts:
        inputs += [str(p) for p in sorted(CORPUS.glob("*.jsonl"))]
        groups["corpus"] = corpus_groups(CORPUS)
    if "podcast" in parts:
        episodes = podcast_episodes(_needed(data_dir / "podcast_transcript.txt"))
        inputs.append(str(write_jsonl(episodes, base / "podcast" / "podcast.jsonl")))
        groups["podcast"] = [PODCAST_GROUP]
    figures: dict[str, Any] = {"parts": parts, "conversations": conversations,
                               "sessions": sessions}
    started = time.perf_counter()
    if store is None:
        store = str(base / "store")
        result = build(config, inputs, store)
        figures["episodes"] = result.summary.get("episodes")
        figures["build_seconds"] = round(time.perf_counter() - started, 1)
    figures["store"] = store
    nlp = load_spacy(config.extract.spacy_model)
    minilm = shared_embedder(config.model_copy(update={"embed": EmbedConfig()}))
    snapshot = stores.current_snapshot(storage.location(store))
    with stores.open_catalog(snapshot) as con:
        if gold:
            figures["locomo_observations"] = observation_recall(con, snapshot, gold,
                                                                minilm.embed)
        if records:
            figures["chinook"] = chinook_figures(records, con)
        measured = [p for p in parts if p != "chinook"]
        figures["generic_nouns"] = {p: generic_share(con, groups[p], nlp) for p in measured}
        figures["person_duplicates"] = {p: person_duplicates(con, groups[p]) for p in parts}
    return figures


def chinook_figures(records: list[dict], con: Any) -> dict[str, Any]:
    mapped: dict[str, int] = defaultdict(int)
    for record in records:
        mapped[record["id"].split("-")[0].capitalize()] += 1
    attribute_only = chinook.attribute_only_entities(records, con)
    return {"records": dict(sorted(mapped.items())),
            "record_entities": chinook.records_by_label(con),
            "entities": con.execute("SELECT count(*) FROM entities WHERE group_id = ?",
                                    [chinook.GROUP]).fetchone()[0],
            "attribute_only_entities": len(attribute_only),
            "attribute_only_examples": attribute_only[:EXAMPLES],
            "reference_edges": chinook.reference_edges(records, con)}


def _needed(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (tkg bench graph reads ../shared/data; "
                                "--data names another folder, --only skips a part)")
    return path


def print_bench(figures: dict[str, Any]) -> None:
    from tkg.jobs.bench.figures import print_figures

    print_figures(f"tkg bench graph: {', '.join(figures['parts'])}", dict(_flat(figures)))


def _flat(figures: dict[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key} ")
        else:
            yield f"{prefix}{key}", ", ".join(map(str, value)) if isinstance(value, list) \
                else value


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("graph", help="graph quality on real data (../shared/data): "
                               "LoCoMo observation recall, chinook records, generic-noun "
                               "entities, person-name duplicates")
    bench.add_argument("--data", default=str(SHARED_DATA), help="the shared data folder")
    bench.add_argument("--only", default=",".join(PARTS),
                       help=f"comma-separated parts of {', '.join(PARTS)}")
    bench.add_argument("--conversations", type=int, default=None,
                       help="only the first N LoCoMo conversations")
    bench.add_argument("--sessions", type=int, default=None,
                       help="only the first N sessions of each LoCoMo conversation")
    bench.add_argument("--config", default=None)
    bench.add_argument("--workdir", default=None, help="keep inputs and store here")
    bench.add_argument("--store", default=None, help="measure this store, built from the "
                       "same parts, instead of building one")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"tkg bench graph: unknown part(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(PARTS)}")
    figures = bench_graph(parts, Path(args.data), config_path=args.config,
                          workdir=args.workdir, conversations=args.conversations,
                          sessions=args.sessions, store=args.store)
    return report(figures, args.json, print_bench)
