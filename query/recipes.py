"""Search recipes: declarative data, never mutated (use `dataclasses.replace` for variants).

A recipe says, per kind of result, which search methods produce candidates and which
reranker orders them; the search code has one path that reads this data.
Methods (`tkg.query.methods.METHODS`): `cosine` (vector index), `bm25` (native full-text
index), `bfs` (graph expansion from the hits, the given `origins` or a conversation's recent
episodes), `linked` (what the people and things the question names said or are mentioned
in, `tkg.query.link`).
Rerankers: `rrf`, `mmr`, `episode_mentions`, `node_distance` (needs `center`),
`cross_encoder` (`query.cross_encoder` picks the model). Episodes can further be scored with
their neighbouring turns, weighed by who spoke them and by the times the question names
(`turn_window`, `other_speaker`, `time_boost`). The default recipe is the config's
`query.recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from tkg.pipeline.config import RECIPE_DEFAULTS, DefaultRecipeWeighing
from tkg.query.methods import METHODS
from tkg.query.rerank import RERANKERS


@dataclass(frozen=True)
class Part:
    """How one kind of result (facts, entities, communities, episodes) is found and ranked."""

    methods: tuple[str, ...] = ("cosine", "bm25")
    reranker: str = "rrf"
    weights: tuple[float, ...] | None = None  # RRF weight of each method (None: 1 each)
    candidates: int | None = None  # per method, before reranking (None: the recipe's)
    # Methods ("cosine", "bm25") that search the question without the names of the speakers
    # it names (`link.NameIndex.without_speakers`): who spoke is the speaker factors'
    # business, and the name matches the other person's turns ("Hey Melanie!"). Among
    # episodes only turns are; records and documents, which name whom they are about, keep
    # the whole question.
    unnamed: tuple[str, ...] = ()
    # "rrf": every method's list fused by rank. "scores": the scored methods' lists
    # (cosine, BM25, linked) first become one by their normalised scores (`rerank.combine`,
    # with `weights`), which then joins the unscored lists (bfs, sources) in RRF at weight 1.
    fusion: str = "rrf"

    def __post_init__(self) -> None:
        for method in self.methods:
            METHODS.factory(method)  # (an unknown one: an error listing the known methods)
        if self.reranker not in RERANKERS or self.fusion not in ("rrf", "scores"):
            raise ValueError(f"unknown method, reranker or fusion in {self}")
        if self.weights is not None and len(self.weights) != len(self.methods):
            raise ValueError(f"one weight per method in {self}")

    def weight(self, method: str) -> float:
        return 1.0 if self.weights is None else self.weights[self.methods.index(method)]


@dataclass(frozen=True)
class Recipe:
    """A named search recipe; each knob is described, with its default, in
    `pipeline.config.RecipeDefaults` (docs/config.md)."""

    name: str
    description: str
    facts: Part | None = None
    entities: Part | None = None
    communities: Part | None = None
    episodes: Part | None = None
    provenance: bool = RECIPE_DEFAULTS.provenance
    provenance_weights: tuple[float, float] = RECIPE_DEFAULTS.provenance_weights
    provenance_facts: int = RECIPE_DEFAULTS.provenance_facts
    entity_provenance: int = RECIPE_DEFAULTS.entity_provenance
    turn_window: tuple[float, float] = RECIPE_DEFAULTS.turn_window
    other_speaker: float = RECIPE_DEFAULTS.other_speaker
    named_speaker: float = RECIPE_DEFAULTS.named_speaker
    time_boost: float = RECIPE_DEFAULTS.time_boost
    bfs_hops: int = RECIPE_DEFAULTS.bfs_hops
    bfs_max_edges: int = RECIPE_DEFAULTS.bfs_max_edges
    bfs_seeds: int = RECIPE_DEFAULTS.bfs_seeds
    conversation_episodes: int = RECIPE_DEFAULTS.conversation_episodes
    candidates: int = RECIPE_DEFAULTS.candidates
    rrf_k: int = RECIPE_DEFAULTS.rrf_k
    cross_encoder_top: int = RECIPE_DEFAULTS.cross_encoder_top
    mmr_lambda: float = RECIPE_DEFAULTS.mmr_lambda


HYBRID = Part(("cosine", "bm25"), "rrf")
HYBRID_BFS = Part(("cosine", "bm25", "bfs"), "rrf")
LINKED_BFS = Part(("cosine", "bm25", "bfs", "linked"), "rrf")
# The default's facts: cosine weighs 1.5 times the other methods, so a fact that means what
# the question asks outranks one that only shares its words; cosine searches the question
# without the named speakers' names (BM25 and `linked` still find the facts that name them).
# Each choice measured in docs/retrieval-history.md.
DEFAULT_FACTS = Part(("cosine", "bm25", "bfs", "linked"), "rrf", weights=(1.5, 1.0, 1.0, 1.0),
                     unnamed=("cosine",))
# The default's episodes: 100 candidates a method, so the turn window sees the hits'
# neighbours; cosine and BM25 fused by normalised score, so a clear winner keeps its lead;
# cosine without the named speakers' names (who spoke is the speaker factors' business).
# Each choice measured in docs/retrieval-history.md.
TURNS = Part(("cosine", "bm25"), "rrf", weights=(1.0, 1.0), candidates=100, unnamed=("cosine",),
             fusion="scores")
DEFAULT_WEIGHING = DefaultRecipeWeighing().model_dump()

RECIPES: MappingProxyType[str, Recipe] = MappingProxyType({r.name: r for r in (
    Recipe("combined_hybrid_rrf", "facts, entities, communities and episodes: cosine + BM25 "
           "+ 2-hop BFS from the hits + what the question's named people said and named "
           "things appear in, fused by RRF; episodes cite the top facts (default)",
           facts=DEFAULT_FACTS, entities=HYBRID_BFS, communities=HYBRID, episodes=TURNS,
           **DEFAULT_WEIGHING),
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
