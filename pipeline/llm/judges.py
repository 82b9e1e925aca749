"""Batched LLM judgements, used only where rules cannot decide: entity pairs left ambiguous
by resolution, invalidation candidates outside every relation class, and community
summaries (map-reduce over members). Each sends one call per batch of items, never one per
item, and an unusable answer decides nothing (the rule-based outcome stands)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tkg.pipeline.adjudicate import NamePair
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.llm import LLM, build_llm
from tkg.pipeline.llm.calls import complete_parsed
from tkg.pipeline.llm.parse import parse_decisions, parse_fields
from tkg.pipeline.llm.prompting import items_request
from tkg.pipeline.llm.schemas import (
    INVALIDATION_DECISIONS_SCHEMA,
    NAMED_SUMMARY_SCHEMA,
    PAIR_DECISIONS_SCHEMA,
    SUMMARY_SCHEMA,
)


def _decide(llm: LLM, template: str, items: list[dict[str, Any]], schema: dict, key: str,
            kind: str) -> list[bool | None]:
    """One call for a batch of items (each with an `id` = its index): one answer per item,
    None where the model gave none (or no usable answer after the retry)."""
    ids = [item["id"] for item in items]
    request = items_request(template, items, schema, "decisions")
    outcome = complete_parsed(llm, [request], lambda _i, text: (parse_decisions(text, key, ids),
                                                                False), kind=kind)[0]
    decisions = outcome.value or {}
    return [decisions.get(i) for i in ids]


class LlmPairJudge:
    """`PairJudge` of pipeline.adjudicate: one call per batch of ambiguous name pairs."""

    def __init__(self, config: TkgConfig, llm: LLM | None = None) -> None:
        self.llm = llm if llm is not None else build_llm(config.llm)

    @property
    def usage(self):
        return self.llm.usage

    def same_entity(self, pairs: Sequence[NamePair]) -> list[bool | None]:
        items = [{"id": i, "a": p.a, "b": p.b, "evidence": p.evidence,
                  "similarity": round(float(p.score), 3)} for i, p in enumerate(pairs)]
        return _decide(self.llm, "judge_pairs", items, PAIR_DECISIONS_SCHEMA, "same",
                       "resolve") if items else []



class LlmInvalidationJudge:
    """Does the newer fact end the older one? For candidates no relation class covers."""

    def __init__(self, config: TkgConfig, llm: LLM | None = None) -> None:
        self.batch_size = config.llm.judge_batch_size
        self.llm = llm if llm is not None else build_llm(config.llm)

    @property
    def usage(self):
        return self.llm.usage

    def ends(self, candidates: Sequence[dict[str, Any]]) -> list[bool | None]:
        """`candidates`: {"older": {fact, relation, valid_at}, "newer": {...}} each."""
        answers: list[bool | None] = []
        for start in range(0, len(candidates), self.batch_size):
            chunk = candidates[start:start + self.batch_size]
            items = [{"id": i, "older": c["older"], "newer": c["newer"]}
                     for i, c in enumerate(chunk)]
            answers += _decide(self.llm, "judge_invalidation", items,
                               INVALIDATION_DECISIONS_SCHEMA, "ends", "facts")
        return answers


class LlmSummarizer:
    """Community names and summaries by map-reduce: a community's members and facts in
    chunks of `llm.summary_batch_size` items, one map call per chunk (all communities of a
    group in one batch of concurrent calls), then one reduce call per community for its
    name and summary. A community that fits one chunk takes the reduce call only. A failed
    answer falls back to the extractive text."""

    def __init__(self, config: TkgConfig, llm: LLM | None = None) -> None:
        from tkg.pipeline.communities import ExtractiveSummarizer

        self.chunk = config.llm.summary_batch_size
        self.fallback = ExtractiveSummarizer(config.communities)
        self.llm = llm if llm is not None else build_llm(config.llm)

    @property
    def usage(self):
        return self.llm.usage

    def _items(self, digest) -> list[dict[str, str]]:
        members = [{"member": m.name, **({"summary": m.summary} if m.summary else {})}
                   for m in digest.central]
        return members + [{"fact": f} for f in digest.facts]

    def summarize(self, targets, group):
        from tkg.pipeline.communities import CommunityText

        chunks = {d.community_id: [self._items(d)[i:i + self.chunk]
                                   for i in range(0, max(len(self._items(d)), 1), self.chunk)]
                  for d in targets}
        partial: dict[str, list[dict[str, str]]] = {d.community_id: [] for d in targets}
        multi = [(cid, part) for cid, parts in chunks.items() if len(parts) > 1
                 for part in parts]
        outcomes = complete_parsed(
            self.llm, [items_request("summarize_map", part, SUMMARY_SCHEMA, "summary")
                       for _, part in multi],
            lambda _i, text: (parse_fields(text, ("summary",)), False), kind="communities")
        for (cid, _), outcome in zip(multi, outcomes, strict=True):
            if outcome.value:
                partial[cid].append({"partial_summary": outcome.value["summary"]})
        reduce_inputs = [partial[d.community_id] if len(chunks[d.community_id]) > 1
                         else chunks[d.community_id][0] for d in targets]
        outcomes = complete_parsed(
            self.llm, [items_request("summarize_reduce", items, NAMED_SUMMARY_SCHEMA, "named")
                       for items in reduce_inputs],
            lambda _i, text: (parse_fields(text, ("name", "summary")), False),
            kind="communities")
        fallback = (self.fallback.summarize(targets, group)
                    if any(o.value is None for o in outcomes) else [])
        return [CommunityText(o.value["name"], o.value["summary"]) if o.value else fallback[i]
                for i, o in enumerate(outcomes)]

