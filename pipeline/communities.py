"""Communities: label-propagation clusters of each group's entity graph.

Pure functions on Arrow tables and numpy arrays, one group at a time:

- `build_graph`: vertices are the group's entities (sorted by id, so vertex order is stable);
  an edge's weight is `fact_weight` per current fact between the two entities (facts whose
  `expired_at` is null: what the store believes now; a fact no longer valid in the world,
  `invalid_at` set, still tells who belonged together and counts `invalidated_weight` times),
  plus `comention_weight` per episode that mentions both.
- `label_propagation`: igraph's weighted label propagation (`variant="fast"`: a queue of
  vertices whose neighbourhood changed, which empties; no synchronous sweeps that can
  oscillate forever), seeded per call, so the same graph always gives the same partition.
- `match_ids`: refreshed clusters keep the id of the old community they mostly overlap
  (Jaccard >= `match_min_jaccard`); others get an id derived from their smallest member.
- `extend`: dynamic extension; an entity outside every community joins the community that
  holds the heaviest share of its edges, in at most `max_iterations` synchronous rounds.
- `digests` + `Summarizer`: the extractive default names a community by its most distinctive
  terms (TF-IDF against the other communities of the group) and summarizes it by its most
  central members and their most mentioned facts; an LLM summarizer plugs in behind the same
  protocol and gets every community of a group in one batch (map-reduce friendly).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import igraph
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import schema, visibility
from tkg.pipeline.config import CommunitiesConfig, TkgConfig
from tkg.pipeline.llm.usage import usage_snapshot, with_usage
from tkg.pipeline.registry import Registry

# --- the graph ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Graph:
    """One group's weighted, undirected entity graph; vertex i is `entity_ids[i]`."""

    group_id: str
    entity_ids: pa.StringArray  # sorted
    names: list[str]
    summaries: list[str | None]
    mentions: np.ndarray  # mention_count per vertex
    lo: np.ndarray  # edge endpoints, lo < hi, unique pairs
    hi: np.ndarray
    weight: np.ndarray
    fact_src: np.ndarray  # current facts, for summaries: endpoints as vertices
    fact_dst: np.ndarray
    fact_text: pa.ChunkedArray  # Arrow: millions of facts, a few read
    fact_episodes: np.ndarray  # provenance episodes per fact (how often it was said)
    fact_invalid: np.ndarray  # no longer valid in the world

    @property
    def n(self) -> int:
        return len(self.entity_ids)


def _vertices(ids: pa.Array, entity_ids: pa.Array) -> np.ndarray:
    """Vertex index of each id (-1 where the id is not an entity of the group)."""
    found = pc.index_in(ids.cast(pa.string()), value_set=entity_ids)
    return np.asarray(found.fill_null(-1), dtype=np.int64)


def _comention_pairs(episodes: np.ndarray, vertices: np.ndarray, cap: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of distinct entities mentioned in one episode, vectorised: rows sorted by
    episode; row r at position p of an episode of size k pairs with the k-1-p rows after it.
    Episodes naming more than `cap` entities (rosters, big records) add no pairs."""
    order = np.lexsort((vertices, episodes))
    episodes, vertices = episodes[order], vertices[order]
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = (episodes[1:] != episodes[:-1]) | (vertices[1:] != vertices[:-1])
    episodes, vertices = episodes[keep], vertices[keep]
    if len(episodes) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]])
    sizes = np.diff(np.r_[starts, len(episodes)])
    size = np.repeat(sizes, sizes)
    position = np.arange(len(episodes)) - np.repeat(starts, sizes)
    later = np.where(size <= cap, size - 1 - position, 0)
    left = np.repeat(np.arange(len(episodes)), later)
    offset = np.arange(len(left)) - np.repeat(np.cumsum(later) - later, later) + 1
    return vertices[left], vertices[left + offset]


def build_graph(group_id: str, entities: pa.Table, facts: pa.Table, mentions: pa.Table,
                config: CommunitiesConfig) -> Graph:
    """The entity graph of one group. `facts` needs source/target_entity_id, fact,
    expired_at, invalid_at and episode_ids (or n_episodes); `mentions` episode_id and
    entity_id. Rows of other groups must already be filtered out."""
    entities = entities.sort_by("entity_id")
    ids = entities["entity_id"].combine_chunks()
    current = visibility.current(facts)
    if "edge_id" in current.column_names:  # ties between facts break by id, not input order
        current = current.sort_by([("edge_id", "ascending")])
    src = _vertices(current["source_entity_id"], ids)
    dst = _vertices(current["target_entity_id"], ids)
    valid = (src >= 0) & (dst >= 0)
    current, src, dst = current.filter(pa.array(valid)), src[valid], dst[valid]
    invalid = np.asarray(pc.is_valid(current["invalid_at"]), dtype=bool)
    if "n_episodes" in current.column_names:
        episodes = np.asarray(current["n_episodes"].fill_null(1), dtype=np.int64)
    else:
        episodes = np.asarray(pc.list_value_length(current["episode_ids"]).fill_null(1),
                              dtype=np.int64)
    fact_w = np.where(invalid, config.fact_weight * config.invalidated_weight,
                      config.fact_weight)
    m_episode = np.asarray(pc.index_in(mentions["episode_id"],
                                       value_set=pc.unique(mentions["episode_id"])))
    m_vertex = _vertices(mentions["entity_id"], ids)
    known = m_vertex >= 0
    c_a, c_b = _comention_pairs(m_episode[known].astype(np.int64), m_vertex[known],
                                config.max_comention_entities)
    a = np.concatenate([src, c_a])
    b = np.concatenate([dst, c_b])
    w = np.concatenate([fact_w, np.full(len(c_a), config.comention_weight)])
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    keep = (lo != hi) & (w > 0)
    n = len(ids)
    keys, inverse = np.unique(lo[keep] * max(n, 1) + hi[keep], return_inverse=True)
    weight = np.bincount(inverse, weights=w[keep], minlength=len(keys))
    counts = (entities["mention_count"].fill_null(0) if "mention_count" in entities.column_names
              else pa.nulls(n, pa.int64()).fill_null(0))
    summaries = (entities["summary"].to_pylist() if "summary" in entities.column_names
                 else [None] * n)
    return Graph(
        group_id=group_id, entity_ids=ids, names=entities["name"].to_pylist(),
        summaries=summaries, mentions=np.asarray(counts, dtype=np.int64),
        lo=keys // max(n, 1), hi=keys % max(n, 1), weight=weight,
        fact_src=src, fact_dst=dst, fact_text=current["fact"],
        fact_episodes=episodes, fact_invalid=invalid,
    )


# --- label propagation and partitions -----------------------------------------------------


def to_igraph(graph: Graph) -> igraph.Graph:
    g = igraph.Graph(n=graph.n)
    if len(graph.lo):
        g.add_edges(np.column_stack([graph.lo, graph.hi]))
    return g


def label_propagation(graph: Graph, config: CommunitiesConfig,
                      g: igraph.Graph | None = None) -> np.ndarray:
    """Raw labels from igraph's weighted label propagation. igraph draws its random numbers
    from a Python generator we seed here (and restore after), so a graph always gives the
    same labels, whatever ran before in the process. igraph takes no iteration cap: the
    "fast" variant is bounded by its queue (a vertex is queued again only when a neighbour
    changed label, and updates are asynchronous, so labels cannot flip-flop as in the
    synchronous loop that hangs Graphiti); our own loops are capped (`extend`)."""
    g = g if g is not None else to_igraph(graph)
    if graph.n == 0:
        return np.zeros(0, dtype=np.int64)
    igraph.set_random_number_generator(random.Random(config.seed))
    try:
        labels = igraph.GraphBase.community_label_propagation(
            g, weights=graph.weight if len(graph.weight) else None, variant=config.variant)
    finally:
        igraph.set_random_number_generator(random)
    return np.asarray(labels, dtype=np.int64)


def clusters(labels: np.ndarray, min_size: int) -> np.ndarray:
    """Cluster index per vertex (-1: in no community), clusters smaller than `min_size`
    dropped and the rest numbered by their smallest vertex (so by smallest entity id)."""
    if len(labels) == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse, sizes = np.unique(labels, return_index=True, return_inverse=True,
                                         return_counts=True)
    big = sizes >= min_size
    rank = np.full(len(sizes), -1, dtype=np.int64)
    kept = np.flatnonzero(big)
    rank[kept[np.argsort(first[kept], kind="stable")]] = np.arange(len(kept))
    return rank[inverse]


def members_of(assign: np.ndarray) -> list[np.ndarray]:
    """Vertices of each cluster, in vertex order."""
    if not len(assign) or assign.max(initial=-1) < 0:
        return []
    order = np.argsort(assign, kind="stable")
    order = order[assign[order] >= 0]
    bounds = np.searchsorted(assign[order], np.arange(assign.max() + 2))
    return [order[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


def previous_assignment(graph: Graph, members: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Previous communities as a cluster index per vertex, and the id of each cluster
    (sorted by id). Members that are no longer entities of the group are dropped."""
    return _assignment(graph.entity_ids, members)


def _assignment(entity_ids: pa.Array, members: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Communities (`members`) as a cluster index per entity of `entity_ids` (-1: in none)
    and the id of each cluster (sorted by id); members outside `entity_ids` are dropped."""
    assign = np.full(len(entity_ids), -1, dtype=np.int64)
    if members.num_rows == 0:
        return assign, []
    vertex = _vertices(members["entity_id"], entity_ids)
    known = vertex >= 0
    community = np.asarray(members["community_id"].to_pylist(), dtype=object)[known]
    ids = sorted(set(community.tolist()))
    index = {c: i for i, c in enumerate(ids)}
    assign[vertex[known]] = [index[c] for c in community]
    return assign, ids


def match_ids(graph: Graph, assign: np.ndarray, old_assign: np.ndarray,
              old_ids: Sequence[str], min_jaccard: float) -> list[str]:
    """An id for each new cluster: the old community it overlaps most (Jaccard at least
    `min_jaccard`, each old id used once, best overlaps first), else one derived from the
    group and the cluster's smallest entity id (so reruns agree)."""
    k = int(assign.max(initial=-1)) + 1
    ids: list[str | None] = [None] * k
    both = (assign >= 0) & (old_assign >= 0)
    if both.any() and len(old_ids):
        new_size = np.bincount(assign[assign >= 0], minlength=k)
        old_size = np.bincount(old_assign[old_assign >= 0], minlength=len(old_ids))
        pairs, overlap = np.unique(assign[both] * len(old_ids) + old_assign[both],
                                   return_counts=True)
        new_c, old_c = pairs // len(old_ids), pairs % len(old_ids)
        jaccard = overlap / (new_size[new_c] + old_size[old_c] - overlap)
        used: set[int] = set()
        for row in np.lexsort((old_c, new_c, -jaccard)):
            if jaccard[row] < min_jaccard:
                break
            if ids[new_c[row]] is None and old_c[row] not in used:
                ids[new_c[row]] = old_ids[old_c[row]]
                used.add(int(old_c[row]))
    taken = {i for i in ids if i is not None}
    for cluster, vertices in enumerate(members_of(assign)):
        if ids[cluster] is not None:
            continue
        smallest = graph.entity_ids[int(vertices.min())].as_py()
        candidate, salt = schema.stable_id(graph.group_id, "community", smallest), 0
        while candidate in taken:
            salt += 1
            candidate = schema.stable_id(graph.group_id, "community", smallest, str(salt))
        ids[cluster] = candidate
        taken.add(candidate)
    return [i for i in ids if i is not None]


def extend(graph: Graph, assign: np.ndarray, max_rounds: int) -> tuple[np.ndarray, int]:
    """Dynamic extension: each vertex outside every community joins the community holding
    the largest total weight of its edges (ties: the lower cluster index). Rounds are
    synchronous, so the result does not depend on an order; a vertex placed in one round
    counts for its neighbours in the next (chains of new entities), up to `max_rounds`."""
    assign = assign.copy()
    placed = 0
    for _ in range(max_rounds):
        a_lo, a_hi = assign[graph.lo], assign[graph.hi]
        into_hi = (a_lo < 0) & (a_hi >= 0)
        into_lo = (a_hi < 0) & (a_lo >= 0)
        node = np.concatenate([graph.lo[into_hi], graph.hi[into_lo]])
        if len(node) == 0:
            break
        community = np.concatenate([a_hi[into_hi], a_lo[into_lo]])
        w = np.concatenate([graph.weight[into_hi], graph.weight[into_lo]])
        k = int(assign.max()) + 1
        keys, inverse = np.unique(node * k + community, return_inverse=True)
        total = np.bincount(inverse, weights=w)
        node_k, community_k = keys // k, keys % k
        best = np.lexsort((community_k, -total, node_k))
        first = np.r_[True, node_k[best][1:] != node_k[best][:-1]]
        chosen = best[first]
        assign[node_k[chosen]] = community_k[chosen]
        placed += len(chosen)
    return assign, placed


# --- partition comparison -----------------------------------------------------------------


def _contingency(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Non-empty cells of the contingency table (count, row, column) and its margins."""
    _, a = np.unique(np.asarray(a), return_inverse=True)
    _, b = np.unique(np.asarray(b), return_inverse=True)
    width = int(b.max(initial=0)) + 1
    keys, cells = np.unique(a * width + b, return_counts=True)
    return cells, keys // width, keys % width, np.bincount(a), np.bincount(b)


def adjusted_rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """ARI of two labelings of the same items (1 = identical partitions, ~0 = chance)."""
    if len(a) < 2:
        return 1.0
    cells, _, _, rows, cols = _contingency(a, b)

    def pairs(x: np.ndarray) -> float:
        return float((x.astype(np.float64) * (x - 1) / 2).sum())

    index, sum_a, sum_b = pairs(cells), pairs(rows), pairs(cols)
    expected = sum_a * sum_b / (len(a) * (len(a) - 1) / 2)
    top = (sum_a + sum_b) / 2
    return 1.0 if top == expected else (index - expected) / (top - expected)


def normalized_mutual_info(a: np.ndarray, b: np.ndarray) -> float:
    """NMI with the arithmetic-mean normalisation (1 = identical partitions)."""
    n = len(a)
    if n == 0:
        return 1.0
    cells, i, j, rows, cols = _contingency(a, b)
    mi = float((cells / n * np.log(cells * n / (rows[i] * cols[j]))).sum())
    h_a = -float((rows / n * np.log(rows / n)).sum())
    h_b = -float((cols / n * np.log(cols / n)).sum())
    if h_a + h_b == 0:
        return 1.0
    return max(0.0, mi / ((h_a + h_b) / 2))


def drift(old_assign: np.ndarray, new_assign: np.ndarray) -> dict[str, float | int | None]:
    """How far a refresh moved the partition: NMI and ARI over the entities in a community
    in either partition (one outside a partition is its own singleton there); None when
    there was no partition before."""
    if not (old_assign >= 0).any():
        return {"entities": int((new_assign >= 0).sum()), "nmi": None, "ari": None}
    either = np.flatnonzero((old_assign >= 0) | (new_assign >= 0))
    solo = -1 - either  # distinct negative labels: singletons

    def labels(x: np.ndarray) -> np.ndarray:
        return np.where(x[either] >= 0, x[either], solo)

    old, new = labels(old_assign), labels(new_assign)
    return {"entities": len(either), "nmi": round(normalized_mutual_info(old, new), 6),
            "ari": round(adjusted_rand_index(old, new), 6)}


# --- summaries and names ------------------------------------------------------------------


@dataclass(frozen=True)
class MemberDigest:
    entity_id: str
    name: str
    summary: str | None
    strength: float  # weight of its edges inside the community


@dataclass(frozen=True)
class CommunityDigest:
    """What a summarizer sees of one community: every member name (for term statistics),
    the most central members first, and the most mentioned facts among them."""

    community_id: str
    group_id: str
    size: int
    central: tuple[MemberDigest, ...]
    facts: tuple[str, ...]
    member_names: tuple[str, ...]
    member_strength: tuple[float, ...]  # centrality of each of member_names


@dataclass(frozen=True)
class CommunityText:
    name: str
    summary: str


class Summarizer(Protocol):
    def summarize(self, targets: Sequence[CommunityDigest],
                  group: Sequence[CommunityDigest]) -> list[CommunityText]:
        """A name and a summary for each of `targets`; `group` is every community of the
        group (context for distinctive terms). One call per group: an LLM summarizer can
        batch its map (per community) and reduce (per name) calls."""
        ...


def _first_per_group(keys: np.ndarray, limit: int) -> np.ndarray:
    """Mask of the first `limit` rows of each run of equal `keys` (already sorted)."""
    if len(keys) == 0:
        return np.zeros(0, dtype=bool)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    run = np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
    return np.arange(len(keys)) - run < limit


def digests(graph: Graph, assign: np.ndarray, ids: Sequence[str],
            config: CommunitiesConfig) -> list[CommunityDigest]:
    """Centrality is the weight of a member's edges inside its community; a community's
    facts are the current facts inside it that touch a central member, valid ones first,
    then by how many episodes said them. Vectorised: one sort for members, one for facts."""
    inside = (assign[graph.lo] >= 0) & (assign[graph.lo] == assign[graph.hi])
    strength = (np.bincount(graph.lo[inside], weights=graph.weight[inside], minlength=graph.n)
                + np.bincount(graph.hi[inside], weights=graph.weight[inside],
                              minlength=graph.n))
    placed = np.flatnonzero(assign >= 0)
    order = placed[np.lexsort((placed, -graph.mentions[placed], -strength[placed],
                               assign[placed]))]
    bounds = np.searchsorted(assign[order], np.arange(len(ids) + 1))
    top = order[_first_per_group(assign[order], config.summary_members)]
    central = np.zeros(graph.n, dtype=bool)
    central[top] = True
    rows = np.flatnonzero((assign[graph.fact_src] >= 0)
                          & (assign[graph.fact_src] == assign[graph.fact_dst])
                          & (central[graph.fact_src] | central[graph.fact_dst]))
    rows = rows[np.lexsort((rows, -graph.fact_episodes[rows], graph.fact_invalid[rows],
                            assign[graph.fact_src[rows]]))]
    rows = rows[_first_per_group(assign[graph.fact_src[rows]], 4 * config.summary_facts)]
    facts: dict[int, list[str]] = {}
    texts = graph.fact_text.take(pa.array(rows, pa.int64())).to_pylist()
    for row, text in zip(rows.tolist(), texts, strict=True):  # a few per community
        chosen = facts.setdefault(int(assign[graph.fact_src[row]]), [])
        if len(chosen) < config.summary_facts and text and text not in chosen:
            chosen.append(text)
    names = graph.names
    out = []
    for c, cid in enumerate(ids):
        members = order[bounds[c]:bounds[c + 1]].tolist()
        out.append(CommunityDigest(
            community_id=cid, group_id=graph.group_id, size=len(members),
            central=tuple(MemberDigest(graph.entity_ids[v].as_py(), names[v],
                                       graph.summaries[v], float(strength[v]))
                          for v in members[:config.summary_members]),
            facts=tuple(facts.get(c, ())),
            member_names=tuple(names[v] for v in members),
            member_strength=tuple(strength[members].tolist()),
        ))
    return out


TOKEN = r"[^\W_][\w&'.-]*[^\W_]|[^\W\d_]"  # words (Rust regex syntax, as Python's)


# Words that name nothing, and legal suffixes (a small list: spaCy's pulls in torch).
STOP_WORDS = frozenset(" ".join("""
a about after again against all also am an and any are as at be because been before being
between both but by can could did do does doing done down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself no nor not now of off on once only or other our ours
out over own same she should so some such than that the their theirs them themselves then
there these they this those through to too under until up very was we were what when where
which while who whom why will with would you your yours yourself since still yet new now
inc incorporated corp corporation co company ltd limited llc plc gmbh
""".splitlines()).split())


def distinctive_terms(documents: Sequence[Sequence[tuple[str, float, bool]]], top: int
                      ) -> list[list[str]]:
    """The `top` most distinctive terms of each document, by TF-IDF against the others.

    A document is a community's texts: (text, weight, is a member name). tf = the summed
    weight of the texts a term occurs in (members weigh by centrality), idf = ln((1 +
    documents) / documents with the term). Terms are lower-cased words with a letter and no
    stop words. A term is shown as the heaviest member name that contains it ("Initech" ->
    "Initech Inc."; a term only found in facts as the word itself), and one label counts
    once. Vectorised (polars): a group can have a million members."""
    import polars as pl

    frame = pl.DataFrame({
        "doc": [i for i, doc in enumerate(documents) for _ in doc],
        "text": [t or "" for doc in documents for t, _, _ in doc],
        "weight": [float(w) for doc in documents for _, w, _ in doc],
        "named": [bool(n) for doc in documents for _, _, n in doc],
    }, schema={"doc": pl.Int64, "text": pl.String, "weight": pl.Float64, "named": pl.Boolean})
    tokens = (frame.with_columns(pl.col("text").str.extract_all(TOKEN).alias("token"))
              .explode("token").drop_nulls("token")
              .with_columns(pl.col("token").str.to_lowercase().alias("term"),
                            pl.when(pl.col("named")).then(pl.col("text"))
                            .otherwise(pl.col("token")).alias("label"))
              .filter(pl.col("term").str.len_chars() > 1,
                      ~pl.col("term").is_in(sorted(STOP_WORDS)),
                      pl.col("term").str.contains(r"[^\W\d_]")))
    tf = tokens.group_by("doc", "term").agg(
        pl.col("weight").sum().alias("tf"),
        pl.col("label").sort_by(["named", "weight", "label"], descending=[True, True, False])
        .first())
    df = tf.group_by("term").len().rename({"len": "df"})
    scored = (tf.join(df, on="term")
              .with_columns((pl.col("tf") * ((1 + len(documents)) / pl.col("df")).log())
                            .alias("score"))
              .sort(["doc", "score", "term"], descending=[False, True, False])
              .group_by("doc", maintain_order=True).head(4 * top))
    out: list[list[str]] = [[] for _ in documents]
    for doc, label in zip(scored["doc"].to_list(), scored["label"].to_list(), strict=True):
        if len(out[doc]) < top and label not in out[doc]:
            out[doc].append(label)
    return out


class ExtractiveSummarizer:
    """The embedded default (no LLM): the name is the community's most distinctive terms
    (TF-IDF of member names, weighted by centrality, and key facts against the group's other
    communities); the summary lists the most central members and their most mentioned
    facts."""

    def __init__(self, config: CommunitiesConfig) -> None:
        self.config = config

    def summarize(self, targets: Sequence[CommunityDigest],
                  group: Sequence[CommunityDigest]) -> list[CommunityText]:
        if not targets:
            return []
        wanted = {d.community_id for d in targets}
        # The targets' terms are scored against every community of the group.
        documents = [d for d in group if d.community_id not in wanted] + list(targets)
        texts = [[*((n, 1 + w, True) for n, w in zip(d.member_names, d.member_strength,
                                                     strict=True)),
                  *((f, 1.0, False) for f in d.facts)] for d in documents]
        top = distinctive_terms(texts, self.config.name_terms)[-len(targets):]
        return [self._text(d, words) for d, words in zip(targets, top, strict=True)]

    def _text(self, digest: CommunityDigest, words: list[str]) -> CommunityText:
        fallback = digest.central[0].name if digest.central else digest.community_id
        people = ", ".join(m.name for m in digest.central)
        summary = f"{digest.size} members, most central: {people}."
        if digest.facts:
            summary += " Key facts: " + " ".join(f.rstrip(".") + "." for f in digest.facts)
        return CommunityText(name=", ".join(words) or fallback,
                             summary=summary[:self.config.summary_chars])


def _extractive(config: TkgConfig) -> ExtractiveSummarizer:
    return ExtractiveSummarizer(config.communities)


SUMMARIZERS: Registry[Summarizer] = Registry("summarizer")
SUMMARIZERS.register("extractive", _extractive)
SUMMARIZERS.register("llm", "tkg.pipeline.llm.judges:LlmSummarizer")


def build_summarizer(config: TkgConfig) -> Summarizer:
    return SUMMARIZERS.build(config.communities.summarizer, config)


# --- one group, end to end ----------------------------------------------------------------


@dataclass(frozen=True)
class Previous:
    """A group's communities in the snapshot a run builds on."""

    communities: pa.Table  # community_id, name, summary, created_at
    members: pa.Table  # community_id, entity_id

    @classmethod
    def empty(cls) -> Previous:
        return cls(schema.COMMUNITY_ROWS.empty_table(), schema.COMMUNITY_MEMBERS.empty_table())


class _Clock:
    """Wall seconds per step into `timings` (and CPU seconds, all threads, as
    `<step>_cpu`), accumulated; nothing when `timings` is None."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.last, self.last_cpu = time.perf_counter(), time.process_time()

    def lap(self, step: str) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self.timings is not None:
            self.timings[step] = self.timings.get(step, 0.0) + now - self.last
            key = f"{step}_cpu"
            self.timings[key] = self.timings.get(key, 0.0) + cpu - self.last_cpu
        self.last, self.last_cpu = now, cpu


@dataclass(frozen=True)
class GroupResult:
    rows: pa.Table  # schema.COMMUNITY_ROWS
    assign: np.ndarray
    previous_assign: np.ndarray
    placed: int
    graph: Graph


def group_communities(graph: Graph, previous: Previous, config: CommunitiesConfig,
                      created_at: datetime, mode: str, summarizer: Summarizer | None = None,
                      timings: dict[str, float] | None = None) -> GroupResult:
    """`mode="refresh"`: label propagation, ids matched against the previous communities.
    `mode="extend"`: the previous communities, with entities outside them placed by
    `extend`; a group without previous communities is refreshed. `timings` (if given)
    receives seconds per step (the benchmark's figures)."""
    clock = _Clock(timings)
    old_assign, old_ids = previous_assignment(graph, previous.members)
    if mode == "extend" and old_ids:
        sizes = np.bincount(old_assign[old_assign >= 0], minlength=len(old_ids))
        alive = np.flatnonzero(sizes >= config.min_size)  # merges can empty a community
        remap = np.full(len(old_ids), -1, dtype=np.int64)
        remap[alive] = np.arange(len(alive))
        start = np.where(old_assign >= 0, remap[np.maximum(old_assign, 0)], -1)
        assign, placed = extend(graph, start, config.max_iterations)
        ids = [old_ids[i] for i in alive]
        fresh = (assign >= 0) & (start < 0)
        changed = set(np.unique(assign[fresh]).tolist())
    else:
        clock.lap("previous")
        g = to_igraph(graph)
        clock.lap("igraph_graph")
        assign = clusters(label_propagation(graph, config, g), config.min_size)
        clock.lap("label_propagation")
        ids = match_ids(graph, assign, old_assign, old_ids, config.match_min_jaccard)
        fresh, placed = np.zeros(graph.n, dtype=bool), 0
        changed = set(range(len(ids)))
    clock.lap("ids")
    rows = _rows(graph, assign, ids, changed, np.bincount(assign[fresh], minlength=len(ids)),
                 previous, config, created_at, summarizer or ExtractiveSummarizer(config))
    clock.lap("summaries")
    return GroupResult(rows=rows, assign=assign, previous_assign=old_assign, placed=placed,
                       graph=graph)


def _rows(graph: Graph, assign: np.ndarray, ids: list[str], changed: set[int],
          placed: np.ndarray, previous: Previous, config: CommunitiesConfig,
          created_at: datetime, summarizer: Summarizer) -> pa.Table:
    """COMMUNITY_ROWS, sorted by id: new text for changed communities, the previous name,
    summary and creation time kept for the others (and the creation time of a matched id)."""
    before = {r["community_id"]: r for r in previous.communities.select(
        ["community_id", "name", "summary", "created_at"]).to_pylist()}
    group = digests(graph, assign, ids, config)
    targets = [d for c, d in enumerate(group)
               if c in changed or ids[c] not in before]
    texts = dict(zip([d.community_id for d in targets],
                     summarizer.summarize(targets, group), strict=True))
    kept = [texts.get(cid) or CommunityText(before.get(cid, {}).get("name") or "",
                                            before.get(cid, {}).get("summary") or "")
            for cid in ids]
    members = np.flatnonzero(assign >= 0)
    members = members[np.argsort(assign[members], kind="stable")]
    offsets = np.searchsorted(assign[members], np.arange(len(ids) + 1)).astype(np.int32)
    table = pa.table({
        "community_id": pa.array(ids, pa.string()),
        "group_id": pa.array([graph.group_id] * len(ids), pa.string()),
        "name": [t.name for t in kept], "summary": [t.summary for t in kept],
        "size": pa.array(np.diff(offsets).astype(np.int64)),
        "created_at": pa.array([before.get(cid, {}).get("created_at") or created_at
                                for cid in ids], schema.TS),
        "placed": pa.array(placed[:len(ids)].astype(np.int64)),
        "members": pa.ListArray.from_arrays(pa.array(offsets),
                                            graph.entity_ids.take(pa.array(members))),
    })
    return schema.conform(table, schema.COMMUNITY_ROWS).sort_by("community_id")


def member_rows(rows: pa.Table) -> pa.Table:
    """community_members from COMMUNITY_ROWS (one row per member)."""
    flat = pc.list_flatten(rows["members"])
    parents = pc.list_parent_indices(rows["members"])
    return pa.table({
        "community_id": pc.take(rows["community_id"], parents),
        "entity_id": flat,
        "group_id": pc.take(rows["group_id"], parents),
    }, schema=schema.COMMUNITY_MEMBERS)


# --- the drift of a refresh ---------------------------------------------------------------


def _numbered_by_first_vertex(assign: np.ndarray) -> np.ndarray:
    """`assign` with its clusters numbered by their smallest vertex, as `clusters` numbers
    a fresh partition (the drift figures then match those of the partition as computed)."""
    inside = np.flatnonzero(assign >= 0)
    _, first, inverse = np.unique(assign[inside], return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    numbered = np.full(len(assign), -1, dtype=np.int64)
    numbered[inside] = rank[np.asarray(inverse).ravel()]
    return numbered


def refresh_drift(entities: pa.Table, before: tuple[pa.Table, pa.Table],
                  after: tuple[pa.Table, pa.Table]) -> dict[str, object]:
    """How far a refresh moved the communities: per group of `entities` (entity_id,
    group_id) its communities before and after and the `drift` of its entities' partition,
    and the `drift` over all groups. `before`, `after`: (communities, community_members)
    of every group, as published; each group's vertices are its entities sorted by id,
    as `build_graph` orders them."""
    def of(table: pa.Table, group: str) -> pa.Table:
        return table.filter(pc.equal(table["group_id"], group))

    report: dict[str, object] = {}
    old_all, new_all, offset = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0
    for group in sorted(pc.unique(entities["group_id"]).drop_null().to_pylist()):
        ids = of(entities, group).sort_by("entity_id")["entity_id"].combine_chunks()
        old, _ = _assignment(ids, of(before[1], group))
        new = _numbered_by_first_vertex(_assignment(ids, of(after[1], group))[0])
        report[group] = {"communities_before": of(before[0], group).num_rows,
                         "communities": of(after[0], group).num_rows, **drift(old, new)}
        old_all.append(np.where(old >= 0, old + offset, -1))
        new_all.append(np.where(new >= 0, new + offset, -1))
        offset += len(ids)
    return {"groups": report,
            "overall": drift(np.concatenate(old_all), np.concatenate(new_all))}


# --- Ray stage helpers: every group's inputs in one shuffle -------------------------------


def input_columns(table_schema: pa.Schema) -> list[str]:
    """The columns of a table that `input_rows` reads (no vectors: less to read)."""
    wanted = {*schema.COMMUNITY_INPUT.names, "episode_ids"}
    return [name for name in table_schema.names if name in wanted]


def input_rows(batch: pa.Table, kind: str) -> pa.Table:
    """A batch of entities, facts (current versions only), mentions, or a previous
    snapshot's communities / members, as COMMUNITY_INPUT rows of `kind`."""
    if kind == "fact":
        batch = visibility.current(batch)
        batch = batch.append_column("n_episodes", pc.list_value_length(batch["episode_ids"]))
    batch = batch.append_column("kind", pa.array([kind] * batch.num_rows, pa.string()))
    return schema.conform(batch, schema.COMMUNITY_INPUT)


def community_block(rows: pa.Table, tkg_config: TkgConfig, created_at: datetime,
                    mode: str) -> pa.Table:
    """One shuffled block (whole groups): COMMUNITY_ROWS of every group in it, plus, for a
    summarizer that calls an LLM, what its calls cost (`llm_*` columns, counted and dropped
    by the stage: the driver never sees this task's client)."""
    config = tkg_config.communities
    summarizer = build_summarizer(tkg_config)
    out = [schema.COMMUNITY_ROWS.empty_table()]
    for group in sorted(pc.unique(rows["group_id"]).drop_null().to_pylist()):
        part = rows.filter(pc.equal(rows["group_id"], group))

        def of(kind: str, part: pa.Table = part) -> pa.Table:
            return part.filter(pc.equal(part["kind"], kind))

        graph = build_graph(group, of("entity"), of("fact"), of("mention"), config)
        previous = Previous(communities=of("community"), members=of("member"))
        out.append(group_communities(graph, previous, config, created_at, mode,
                                     summarizer).rows)
    table = pa.concat_tables(out)
    if getattr(summarizer, "usage", None) is None:
        return table
    return with_usage(table, {}, usage_snapshot(summarizer))
