"""`tkg bench resolution`: synthetic mentions with known duplicates through the resolver's Ray
plan; prints pairwise precision, recall and seconds. Figures only, never a gate.

About five mentions per true entity, each a variant of its name: exact, case (``ACME``),
a typo (one substitution, deletion or transposition), an abbreviation (``Corp`` for
``Corporation``, ``Mt.`` for ``Mount``, an honorific) or another word order (``Okafor,
Daniel``). Names come from syllables, so near-collisions between different entities happen
as they do in real data. Name vectors are synthetic: each entity has a random direction and
its variants sit near it (cosine about `variant_cosine`), so the embedder's speed is not what
this measures, only the resolver's.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tkg.jobs.bench.figures import print_figures, report

_FIRST_NAMES = (
    "James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara "
    "Richard Susan Joseph Jessica Thomas Sarah Charles Karen Daniel Lisa Matthew Nancy Anthony "
    "Betty Mark Sandra Donald Ashley Steven Kimberly Andrew Emily Joshua Donna Kenneth "
    "Michelle Kevin Carol Brian Amanda George Melissa Timothy Deborah Ronald Stephanie Jason "
    "Rebecca Edward Sharon Jeffrey Laura Ryan Cynthia Jacob Amy Gary Kathleen Nicholas Angela "
    "Eric Shirley Jonathan Brenda Stephen Emma Larry Anna Justin Pamela Scott Nicole Brandon "
    "Samantha Benjamin Katherine Samuel Christine Gregory Helen Alexander Debra Patrick Rachel "
    "Frank Carolyn Raymond Janet Jack Maria Dennis Olivia Jerry Heather Tyler Catherine Aaron "
    "Diane Jose Julie Adam Victoria Nathan Joyce Henry Lauren Zachary Kelly Douglas Christina "
    "Peter Ruth Kyle Joan Noah Virginia Ethan Judith Jeremy Evelyn Walter Hannah Christian "
    "Andrea Keith Megan Roger Cheryl Terry Jacqueline Austin Madison Sean Teresa Gerald Abigail "
    "Carl Sophia Harold Martha Dylan Sara Arthur Gloria Lawrence Janice Jordan Kathryn Jesse "
    "Ann Bryan Isabella Billy Judy Bruce Charlotte Gabriel Julia Joe Grace Logan Amber Albert "
    "Alice Willie Jean Alan Denise Vincent Frances Eugene Danielle Russell Marilyn Elijah "
    "Natalie Randy Beverly Philip Diana Harry Brittany Howard Theresa Roy Kayla Louis Alexis "
    "Sofia Mateo Amara Kenji Priya Arjun Mei Wei Chidi Ngozi Lars Ingrid Pierre Amelie Diego"
)
FIRST_NAMES = _FIRST_NAMES.split()
_ONSETS = ("b bl br c ch cl cr d dr f fl fr g gl gr h j k kr l m n p pl pr qu r s sh sl st t th "
           "tr v w z")
ONSETS = _ONSETS.split()
VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ie", "oa", "ou", "y")
CODAS = ("", "", "", "n", "r", "l", "s", "t", "m", "nd", "rk", "ck", "x", "ng", "ll", "ss")
_INDUSTRIES = ("Logistics Foods Systems Labs Partners Holdings Energy Media Robotics Analytics "
               "Textiles Pharma Motors Capital Networks Dynamics Studios Ventures Brewing "
               "Insurance")
INDUSTRIES = _INDUSTRIES.split()
SUFFIXES = {"Corporation": "Corp", "Incorporated": "Inc", "Limited": "Ltd",
            "International": "Intl", "Manufacturing": "Mfg", "Brothers": "Bros"}
PLACE_PREFIXES = {"Mount": "Mt.", "Saint": "St.", "Fort": "Ft.", "Port": "Pt.",
                  "Lake": "Lake", "New": "New"}
HONORIFICS = ("Dr.", "Mr.", "Ms.", "Prof.")
VARIANTS = ("exact", "case", "typo", "abbreviation", "order")
VARIANT_WEIGHTS = (0.3, 0.15, 0.25, 0.15, 0.15)


@dataclass(frozen=True)
class TrueEntity:
    name: str
    label: str  # Person, Organization, Location


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = []
    for _ in range(syllables):
        parts += [rng.choice(ONSETS), rng.choice(VOWELS)]
    parts.append(rng.choice(CODAS))
    return "".join(parts).capitalize()


def true_entities(count: int, rng: np.random.Generator) -> list[TrueEntity]:
    """`count` distinct names: 60% people, 25% organizations, 15% places."""
    seen: set[str] = set()
    entities: list[TrueEntity] = []
    while len(entities) < count:
        kind = rng.random()
        if kind < 0.6:
            name, label = f"{rng.choice(FIRST_NAMES)} {_word(rng, int(rng.integers(2, 4)))}", \
                "Person"
        elif kind < 0.85:
            words = [_word(rng, int(rng.integers(2, 4)))]
            if rng.random() < 0.5:
                words.append(str(rng.choice(INDUSTRIES)))
            words.append(str(rng.choice(list(SUFFIXES))))
            name, label = " ".join(words), "Organization"
        else:
            prefix = str(rng.choice(list(PLACE_PREFIXES)))
            name, label = f"{prefix} {_word(rng, int(rng.integers(2, 4)))}", "Location"
        if name.casefold() not in seen:
            seen.add(name.casefold())
            entities.append(TrueEntity(name, label))
    return entities


def _typo(name: str, rng: np.random.Generator) -> str:
    words = name.split()
    index = max(range(len(words)), key=lambda i: len(words[i]))
    word = words[index]
    if len(word) < 5:
        return name
    at = int(rng.integers(1, len(word) - 2))
    edit = rng.integers(0, 3)
    if edit == 0:  # substitution by a neighbouring letter
        word = word[:at] + chr((ord(word[at]) - 97 + 1) % 26 + 97) + word[at + 1:]
    elif edit == 1:  # deletion
        word = word[:at] + word[at + 1:]
    else:  # transposition
        word = word[:at] + word[at + 1] + word[at] + word[at + 2:]
    words[index] = word
    return " ".join(words)


def _abbreviation(entity: TrueEntity, rng: np.random.Generator) -> str:
    words = entity.name.split()
    if entity.label == "Person":
        return f"{rng.choice(HONORIFICS)} {entity.name}"
    if entity.label == "Organization":
        words[-1] = SUFFIXES[words[-1]] + ("." if rng.random() < 0.5 else "")
        return " ".join(words)
    words[0] = PLACE_PREFIXES[words[0]]
    return " ".join(words)


def variant(entity: TrueEntity, kind: str, rng: np.random.Generator) -> str:
    if kind == "case":
        return entity.name.upper() if rng.random() < 0.5 else entity.name.lower()
    if kind == "typo":
        return _typo(entity.name, rng)
    if kind == "abbreviation":
        return _abbreviation(entity, rng)
    if kind == "order" and entity.label == "Person":
        first, last = entity.name.split(" ", 1)
        return f"{last}, {first}"
    return entity.name


def synthetic_mentions(count: int, *, seed: int = 0, groups: int = 4,
                       per_entity: float = 5.0) -> pa.Table:
    """`count` mentions: group_id, name, label, truth (the true entity's index)."""
    rng = np.random.default_rng(seed)
    entities = true_entities(max(int(count / per_entity), 1), rng)
    counts = np.maximum(rng.poisson(per_entity - 1, len(entities)) + 1, 1)
    truth = np.repeat(np.arange(len(entities)), counts)[:count]
    if len(truth) < count:
        truth = np.concatenate([truth, rng.integers(0, len(entities), count - len(truth))])
    kinds = rng.choice(len(VARIANTS), size=count, p=VARIANT_WEIGHTS)
    names = [variant(entities[t], VARIANTS[k], rng) for t, k in zip(truth, kinds, strict=True)]
    return pa.table({
        "group_id": pa.array([f"g{t % groups}" for t in truth], pa.string()),
        "name": pa.array(names, pa.string()),
        "label": pa.array([entities[t].label for t in truth], pa.string()),
        "truth": pa.array(truth, pa.int64()),
    })


def extractions(mentions: pa.Table, per_episode: int = 5) -> pa.Table:
    """Mentions packed into synthetic episodes (the resolver's input), per group."""
    from tkg.pipeline import schema

    rows = []
    when = datetime(2024, 1, 1, tzinfo=UTC)
    by_group: dict[str, list[dict]] = {}
    for row in mentions.select(["group_id", "name", "label"]).to_pylist():
        by_group.setdefault(row["group_id"], []).append(
            {"name": row["name"], "label": row["label"], "attributes": None})
    for group_id, items in sorted(by_group.items()):
        for start in range(0, len(items), per_episode):
            rows.append({"episode_id": f"{group_id}-{start}", "group_id": group_id,
                         "valid_at": when, "entities": items[start:start + per_episode],
                         "facts": [], "error": None, "raw_output": None})
    return pa.Table.from_pylist(rows, schema=schema.EXTRACTIONS)


class SyntheticVectors:
    """Ray Data UDF: a name node's vector = its true entity's direction + variant noise."""

    def __init__(self, truth_of: dict[tuple[str, str], int], dim: int, cosine: float,
                 seed: int) -> None:
        self.truth_of, self.dim, self.seed = truth_of, dim, seed
        self.noise = float(np.sqrt(1 / cosine**2 - 1))  # |noise| for that expected cosine

    def __call__(self, batch: pa.Table) -> pa.Table:
        from tkg.pipeline import schema

        keys = zip(batch["group_id"].to_pylist(), batch["normalized"].to_pylist(), strict=True)
        truths = np.array([self.truth_of.get(k, -1) for k in keys], dtype=np.int64)
        base = np.stack([np.random.default_rng((self.seed, int(t))).standard_normal(self.dim)
                         for t in truths]) if len(truths) else np.zeros((0, self.dim))
        base /= np.linalg.norm(base, axis=1, keepdims=True) + 1e-12
        noise = np.random.default_rng((self.seed, len(truths), int(truths.sum()))
                                      ).standard_normal(base.shape)
        noise *= self.noise / np.sqrt(self.dim)
        vectors = base + noise
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-12
        flat = pa.array(vectors.astype(np.float32).ravel(), pa.float32())
        column = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        return batch.append_column("name_embedding", column.cast(schema.vector(self.dim)))


def pairwise_scores(truth: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Pairwise precision and recall of a clustering of mentions, from the contingency table
    (no pair enumeration)."""
    def pairs(counts: np.ndarray) -> int:
        return int((counts * (counts - 1) // 2).sum())

    _, predicted_ids = np.unique(predicted, return_inverse=True)
    cells = np.unique(truth.astype(np.int64) * (predicted_ids.max() + 1) + predicted_ids,
                      return_counts=True)[1]
    both = pairs(cells)
    said = pairs(np.unique(predicted_ids, return_counts=True)[1])
    true = pairs(np.unique(truth, return_counts=True)[1])
    return {"precision": round(both / said, 4) if said else 1.0,
            "recall": round(both / true, 4) if true else 1.0,
            "true_pairs": true, "predicted_pairs": said}


def bench_resolution(mentions: int, *, seed: int = 0, groups: int = 4, dim: int = 384,
                     variant_cosine: float = 0.9, config_path: str | None = None,
                     workdir: str | None = None) -> dict[str, Any]:
    """Generate, resolve through the build's stages, score; returns the figures."""
    import pyarrow.parquet as pq
    import ray.data
    from ray.data import ActorPoolStrategy
    from tkg.pipeline import resolve, store
    from tkg.pipeline.build import init_ray
    from tkg.pipeline.config import load_config
    from tkg.pipeline.stages import RunContext, names_stage, resolve_stage

    config = load_config(config_path)
    started = time.perf_counter()
    table = synthetic_mentions(mentions, seed=seed, groups=groups)
    episodes = extractions(table)
    normalized = [resolve.normalize_name(n) for n in table["name"].to_pylist()]
    truth_votes: dict[tuple[str, str], Counter[int]] = {}
    for g, n, t in zip(table["group_id"].to_pylist(), normalized, table["truth"].to_pylist(),
                       strict=True):
        truth_votes.setdefault((g, n), Counter())[t] += 1
    truth_of = {key: votes.most_common(1)[0][0] for key, votes in truth_votes.items()}
    generate_seconds = time.perf_counter() - started

    cpus = init_ray(config)
    with tempfile.TemporaryDirectory(prefix="tkg-bench-resolution-") as tmp:
        root = Path(workdir or tmp)
        ctx = RunContext(config=config, run_id="bench-resolution", created_at=store.now(),
                         files=[], work_dir=root, dim=dim, cpus=cpus)
        seconds: dict[str, float] = {}
        clock = time.perf_counter()
        source = ray.data.from_arrow(episodes).repartition(2 * cpus).materialize()
        named = names_stage(ctx, {"extractions": source})
        nodes = named["name_nodes"].materialize()
        mentions_ds = named["entity_mentions"].materialize()
        seconds["names"] = time.perf_counter() - clock

        clock = time.perf_counter()
        vectors = nodes.map_batches(
            SyntheticVectors, fn_constructor_args=(truth_of, dim, variant_cosine, seed),
            batch_format="pyarrow", compute=ActorPoolStrategy(size=1), batch_size=4096,
        ).materialize()
        seconds["synthetic_vectors (not counted)"] = time.perf_counter() - clock

        clock = time.perf_counter()
        out = resolve_stage(ctx, {"name_vectors": vectors, "extractions": source,
                                  "entity_mentions": mentions_ds})
        alias_map = out["alias_map"].materialize()
        entities = out["resolved_entities"].materialize()
        seconds["resolve"] = time.perf_counter() - clock
        alias_path = root / "alias_map"
        alias_map.write_parquet(str(alias_path))
        mapping = pq.read_table(alias_path).select(["group_id", "normalized", "entity_id"])

    resolver_seconds = seconds["names"] + seconds["resolve"]
    entity_of = dict(zip(zip(mapping["group_id"].to_pylist(), mapping["normalized"].to_pylist(),
                             strict=True), mapping["entity_id"].to_pylist(), strict=True))
    predicted = np.array([hash(entity_of[(g, n)]) for g, n in
                          zip(table["group_id"].to_pylist(), normalized, strict=True)])
    scores = pairwise_scores(table["truth"].to_numpy(), predicted)
    return {
        "mentions": mentions,
        "true_entities": len(np.unique(table["truth"].to_numpy())),
        "resolved_entities": entities.count(),
        "name_nodes": nodes.count(),
        "groups": groups,
        "dim": dim,
        "variant_cosine": variant_cosine,
        **scores,
        "seconds": round(resolver_seconds, 2),
        "mentions_per_second": round(mentions / resolver_seconds, 1),
        "stage_seconds": {k: round(v, 2) for k, v in seconds.items()},
        "generate_seconds": round(generate_seconds, 2),
        "ambiguous_pairs": ctx.counters.get("ambiguous_pairs", 0),
    }


def add_command(benches: argparse._SubParsersAction) -> None:
    bench = benches.add_parser("resolution", help="synthetic mentions with known duplicates "
                               "through the resolver; pairwise precision/recall and seconds")
    bench.add_argument("--mentions", type=int, default=100_000)
    bench.add_argument("--groups", type=int, default=4)
    bench.add_argument("--dim", type=int, default=384)
    bench.add_argument("--variant-cosine", type=float, default=0.9,
                       help="expected cosine between a name variant and its entity")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--config", default=None)
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(fn=run_command)


def run_command(args: argparse.Namespace) -> int:
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    figures = bench_resolution(args.mentions, seed=args.seed, groups=args.groups, dim=args.dim,
                               variant_cosine=args.variant_cosine, config_path=args.config)
    return report(figures, args.json, print_bench)


def print_bench(figures: dict[str, Any]) -> None:
    print_figures(f"tkg bench resolution: {figures['mentions']:,} mentions", figures)
