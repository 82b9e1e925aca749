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
# On LoCoMo (1,536 questions, embedded default) adding `linked` to the default's facts and
# episodes raised evidence recall@10 from 0.585 to 0.598 (multi-hop 0.372 -> 0.381,
# open-domain 0.310 -> 0.360, single-hop 0.651 -> 0.666, temporal 0.680 -> 0.679).
LINKED_BFS = Part(("cosine", "bm25", "bfs", "linked"), "rrf")
# The default's facts: cosine at 1.5 times the other methods' weight, so a fact that means
# what the question asks ("activities" -> "signed up for a pottery class") outranks one that
# only shares its words. LoCoMo evidence recall@10 (via the top facts' sources): multi-hop
# 0.422 -> 0.429, temporal 0.766 -> 0.767, open-domain and single-hop unchanged, recall@1
# 0.319 -> 0.321; corpus 0.941 unchanged. Weight 1.75 or 2: multi-hop 0.428-0.430 but the
# corpus 0.929; bfs at 0.5 or linked at 1.5 beside it: the corpus 0.929 too.
# Its cosine searches the question without the named speakers' names (`unnamed`; BM25 and
# `linked` still find the facts that name them): LoCoMo 0.742 -> 0.745, multi-hop 0.489 ->
# 0.490, temporal 0.788 -> 0.805, open-domain 0.456 -> 0.464, single-hop 0.841 -> 0.839;
# corpus 0.941. BM25 too: LoCoMo 0.745 (multi-hop 0.494, open-domain 0.501), but "Marcus
# Bell works as" then lost his current title in the corpus's top 5 facts.
DEFAULT_FACTS = Part(("cosine", "bm25", "bfs", "linked"), "rrf", weights=(1.5, 1.0, 1.0, 1.0),
                     unnamed=("cosine",))
# The default's episodes and how it fuses and weighs them, each chosen on LoCoMo (evidence
# recall@10 over 1,536 questions, one store, replaying the search offline step by step;
# figures cumulative unless marked alone; the corpus questions, tests/questions/corpus.jsonl,
# checked each step):
# - BM25 at twice cosine's weight (in RRF, before fusion "scores"): 0.633 -> 0.647 (MiniLM
#   alone ranks turns below BM25: 0.453 vs 0.508).
# - `linked` dropped from episodes once speakers are weighed (among one speaker's turns it
#   is cosine again: 0.594 with it, 0.604 without).
# - Every method's list scored with the neighbouring turns, turn_window (0.5, 0.5): 0.650 ->
#   0.692 (single-hop 0.700 -> 0.768; 0.7 or 0.3 instead: within 0.01; summing instead of
#   max scored 0.01 higher but cost a tenth of recall@1; smoothing the fused list instead of
#   each method's: 0.684). It replaces fusing the turns next to the top 5 hits at weight 0.5,
#   which pushed the best direct hit down (recall@1 0.248 -> 0.175).
# - 100 candidates a method, so the window sees the hits' neighbours (40: 0.704, 100: 0.706,
#   every turn: 0.710).
# - other_speaker 0.5, alone: 0.602 -> 0.635 (0: 0.633); recall@1 0.275 -> 0.287. Turns
#   that name a named person or thing are not weighed down: on the corpus, where colleagues
#   speak about each other, weighing them down too cost 0.15 of recall@10.
# - time_boost 2: 0.692 -> 0.710 (single-hop 0.768 -> 0.793, temporal 0.775 -> 0.790;
#   1.5: 0.705, 3: 0.710).
# - provenance_facts 10: 20 facts gave LoCoMo the same overall (0.699 vs 0.698) but cost
#   the corpus 0.07 (0.929 -> 0.860): facts there cite many records each.
# - rrf_k 40 (every kind's fusion): LoCoMo 0.713 -> 0.719, recall@1 0.321 -> 0.332 (k 20:
#   0.718, 100: 0.704); corpus 0.929 -> 0.941 (k 20 and 30 the same).
# - named_speaker 1.5: 0.706 -> 0.720 (multi-hop 0.429 -> 0.452, temporal 0.767 -> 0.790,
#   open-domain 0.388 -> 0.402, single-hop 0.809 -> 0.818); 1.25: 0.718; 2: 0.720 but the
#   corpus 0.941 -> 0.866. In LoCoMo 96% of the evidence turns of a question naming a
#   speaker are that speaker's own.
# - unnamed ("cosine",): 0.720 -> 0.742 (multi-hop 0.452 -> 0.489, open-domain 0.402 ->
#   0.456, single-hop 0.818 -> 0.841, temporal 0.790 -> 0.788; recall@1 0.333 -> 0.348).
#   BM25 unnamed too: LoCoMo 0.738 (multi-hop 0.500) but the corpus 0.941 -> 0.884, whose
#   evidence includes others' turns that name the person ("Tom goes to Oak Park Primary").
#   Records and documents keep the name: without that the corpus lost a CRM record (0.931).
# - fusion "scores": cosine and BM25 summed by normalised score (weights 1 and 1) into one
#   list that joins the sources in RRF, the top facts' at 0.25 and the entities' latest
#   mentions at 0.05: 0.745 -> 0.767 (multi-hop 0.490 -> 0.511, temporal 0.805 -> 0.796,
#   open-domain 0.464 -> 0.537, single-hop 0.839 -> 0.866; recall@1 0.349 -> 0.340). RRF
#   of the ranks threw away how far ahead a clear cosine or BM25 winner was. Mentions at 0:
#   the corpus lost a sales order at rank 10 (0.941 -> 0.929); facts at 1/3: multi-hop
#   0.500; BM25 at 1.5 or 0.75: lower in replay.
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
