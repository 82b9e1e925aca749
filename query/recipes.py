"""Search recipes: declarative data, never mutated (use `dataclasses.replace` for variants).

A recipe says, per kind of result, which search methods produce candidates and which
reranker orders them; the search code has one path that reads this data.
Methods: `cosine` (vector index), `bm25` (native full-text index), `bfs` (graph expansion
from the hits, the given `origins` or a conversation's recent episodes), `linked` (what the
people and things the question names said or are mentioned in, `tkg.query.link`).
Rerankers: `rrf`, `mmr`, `episode_mentions`, `node_distance` (needs `center`),
`cross_encoder` (`query.cross_encoder` picks the model). The default recipe is the config's
`query.recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from tkg.query.rerank import RERANKERS

METHODS = frozenset({"cosine", "bm25", "bfs", "linked"})


@dataclass(frozen=True)
class Part:
    """How one kind of result (facts, entities, communities, episodes) is found and ranked."""

    methods: tuple[str, ...] = ("cosine", "bm25")
    reranker: str = "rrf"

    def __post_init__(self) -> None:
        if not set(self.methods) <= METHODS or self.reranker not in RERANKERS:
            raise ValueError(f"unknown method or reranker in {self}")


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    facts: Part | None = None
    entities: Part | None = None
    communities: Part | None = None
    episodes: Part | None = None
    provenance: bool = True  # the episodes list also cites the top facts' and entities' sources
    # RRF weights of the three lists fused into `episodes`: episode hits, the top facts'
    # provenance, the top entities' latest mentions. Weight 0 keeps the entities' mentions
    # in the list but after everything else: on tests/questions/corpus.jsonl any positive
    # weight lowered evidence recall@10 (0.1: 0.878, 0.5: 0.866, 0: 0.902).
    provenance_weights: tuple[float, float, float] = (1.0, 1.0, 0.0)
    # RRF weight of the turns next to the top `neighbour_top` episodes (0: none), fused
    # into `episodes` after provenance. The default's 0.5 (top 5): LoCoMo recall@10
    # 0.598 -> 0.605 (multi-hop 0.381 -> 0.380; weight 1.0 over the top 3: 0.555);
    # tests/questions/corpus.jsonl 0.920 -> 0.946 (multi_hop 0.667 -> 0.867).
    neighbour_weight: float = 0.0
    neighbour_top: int = 5
    bfs_hops: int = 2
    bfs_max_edges: int = 400  # edges expanded per hop: bounds a query on a hub entity
    bfs_seeds: int = 5  # top hits of each kind whose entities seed the expansion
    candidates: int = 40  # per method, before reranking
    rrf_k: int = 60
    cross_encoder_top: int = 20  # RRF's top candidates re-scored by the cross-encoder
    mmr_lambda: float = 0.5


HYBRID = Part(("cosine", "bm25"), "rrf")
HYBRID_BFS = Part(("cosine", "bm25", "bfs"), "rrf")
# On LoCoMo (1,536 questions, embedded default) adding `linked` to the default's facts and
# episodes raised evidence recall@10 from 0.585 to 0.598 (multi-hop 0.372 -> 0.381,
# open-domain 0.310 -> 0.360, single-hop 0.651 -> 0.666, temporal 0.680 -> 0.679).
LINKED = Part(("cosine", "bm25", "linked"), "rrf")
LINKED_BFS = Part(("cosine", "bm25", "bfs", "linked"), "rrf")

RECIPES: MappingProxyType[str, Recipe] = MappingProxyType({r.name: r for r in (
    Recipe("combined_hybrid_rrf", "facts, entities, communities and episodes: cosine + BM25 "
           "+ 2-hop BFS from the hits + what the question's named people said and named "
           "things appear in, fused by RRF; episodes cite the top facts (default)",
           facts=LINKED_BFS, entities=HYBRID_BFS, communities=HYBRID, episodes=LINKED,
           neighbour_weight=0.5),
    Recipe("combined_cross_encoder", "as combined_hybrid_rrf, candidates reordered by the "
           "cross-encoder (on CPU: a second-pass bi-encoder score)",
           facts=Part(("cosine", "bm25", "bfs"), "cross_encoder"),
           entities=Part(("cosine", "bm25", "bfs"), "cross_encoder"),
           communities=Part(("cosine", "bm25"), "cross_encoder"),
           episodes=Part(("cosine", "bm25"), "cross_encoder")),
    Recipe("facts_hybrid_rrf", "facts only: cosine + BM25, RRF", facts=HYBRID),
    Recipe("facts_hybrid_mmr", "facts only: cosine + BM25 candidates, MMR for diversity",
           facts=Part(("cosine", "bm25"), "mmr")),
    Recipe("facts_node_distance", "facts only: cosine + BM25 + BFS from `center`, ranked by "
           "shortest-path hops from the center entity",
           facts=Part(("cosine", "bm25", "bfs"), "node_distance")),
    Recipe("facts_episode_mentions", "facts only: cosine + BM25, most-mentioned first",
           facts=Part(("cosine", "bm25"), "episode_mentions")),
    Recipe("entities_hybrid_rrf", "entities only: cosine + BM25 + BFS, RRF",
           entities=HYBRID_BFS),
    Recipe("communities_hybrid_rrf", "communities only: cosine + BM25, RRF",
           communities=HYBRID),
    Recipe("episodes_flat_rrf", "the flat baseline: BM25 + cosine over episodes alone, RRF "
           "(no graph)", episodes=HYBRID, provenance=False),
)})
BASELINE = "episodes_flat_rrf"


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose one of: {', '.join(RECIPES)}"
                         ) from None
