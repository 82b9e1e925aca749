"""The judges: where rules cannot decide, a judge may, in batches.

- Pair judges: name pairs that resolution rules cannot decide (an embedding neighbour below
  the merge threshold, say). A pair judge is anything with `same_entity(pairs) -> [True |
  False | None]`; `None` means "cannot tell" and, like no judge at all, keeps the pair apart
  (the conservative decision: a wrong merge corrupts two entities, a missed one only leaves
  a duplicate). `resolve.adjudicator` picks one from `PAIR_JUDGES`.
- Invalidation judges: two dated facts of one subject and relation that no relation class
  covers. `ends(candidates) -> [True | False | None]`; only True ends the older fact.
  `facts.invalidation_judge` picks one from `INVALIDATION_JUDGES`.

`none`, the embedded default of both, is no judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.registry import Registry

if TYPE_CHECKING:
    from ray.data import Dataset
    from tkg.pipeline.context import RunContext


@dataclass(frozen=True)
class NamePair:
    """Two name nodes of one group (normalized names) and the evidence that paired them."""

    group_id: str
    a: str
    b: str
    evidence: str
    score: float


class PairJudge(Protocol):
    def same_entity(self, pairs: Sequence[NamePair]) -> list[bool | None]:
        """One answer per pair, in order: True = one entity, False/None = keep apart."""
        ...


class InvalidationJudge(Protocol):
    def ends(self, candidates: Sequence[dict[str, Any]]) -> list[bool | None]:
        """One answer per {"older": {...}, "newer": {...}}: True = the newer ends the older."""
        ...


PAIR_JUDGES: Registry[PairJudge] = Registry("pair judge")
PAIR_JUDGES.register("llm", "tkg.pipeline.llm.judges:LlmPairJudge")

INVALIDATION_JUDGES: Registry[InvalidationJudge] = Registry("invalidation judge")
INVALIDATION_JUDGES.register("llm", "tkg.pipeline.llm.judges:LlmInvalidationJudge")


def build_judge(config: TkgConfig) -> PairJudge | None:
    name = config.resolve.adjudicator
    return None if name == "none" else PAIR_JUDGES.build(name, config)


def build_invalidation_judge(config: TkgConfig) -> InvalidationJudge | None:
    name = config.facts.invalidation_judge
    return None if name == "none" else INVALIDATION_JUDGES.build(name, config)


def adjudicate(pairs: pa.Table, judge: PairJudge, batch_size: int) -> tuple[pa.Table, int]:
    """Undecided pairs (`merge` false) judged in batches; a yes becomes a merge with evidence
    `llm`. Returns the pairs and the number of judge calls."""
    undecided = pc.invert(pairs["merge"]).to_pylist()
    index = [i for i, flag in enumerate(undecided) if flag]
    if not index:
        return pairs, 0
    rows = pairs.to_pylist()
    calls = 0
    for start in range(0, len(index), batch_size):
        chunk = index[start:start + batch_size]
        questions = [NamePair(rows[i]["group_id"], rows[i]["a"], rows[i]["b"],
                              rows[i]["evidence"], rows[i]["score"]) for i in chunk]
        answers = judge.same_entity(questions)
        calls += 1
        if len(answers) != len(questions):  # a bad answer decides nothing
            continue
        for i, same in zip(chunk, answers, strict=True):
            if same is True:
                rows[i]["merge"] = True
                rows[i]["evidence"] = "llm"
    return pa.Table.from_pylist(rows, schema=pairs.schema), calls


def judge_invalidations(ctx: RunContext, edges: Dataset, judge: InvalidationJudge) -> Dataset:
    """The facts stage's optional step: candidates the rules cannot decide are judged on the
    driver in batches (few: one per subject, relation and change of value) and the yeses
    applied; the rule-based invalidation is already in `edges` and stays as it is."""
    from tkg.pipeline import engine, facts
    from tkg.pipeline.llm.usage import count_usage, usage_snapshot

    edges = edges.materialize()
    candidates = engine.gather(
        ctx, engine.map(ctx, edges, facts.undecided_candidates, ctx.config.facts),
        what="invalidation candidates").to_pylist()
    ctx.count("invalidation_candidates", len(candidates))
    if not candidates:
        return edges
    questions = [{"older": {"fact": c["old_fact"], "relation": c["relation"],
                            "valid_at": c["old_valid_at"].isoformat()},
                  "newer": {"fact": c["new_fact"], "relation": c["relation"],
                            "valid_at": c["new_valid_at"].isoformat()}} for c in candidates]
    answers = judge.ends(questions)
    count_usage(ctx, usage_snapshot(judge), "facts")  # a judge built for this run
    ended = {c["old_edge_id"]: (c["new_valid_at"], c["new_edge_id"])
             for c, yes in zip(candidates, answers, strict=True) if yes is True}
    ctx.count("invalidated_by_llm", len(ended))
    return engine.map(ctx, edges, facts.apply_judged, ended)
