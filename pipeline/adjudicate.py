"""The adjudicator hook: name pairs that resolution rules cannot decide (an embedding
neighbour below the merge threshold, say) go to a judge, in batches.

A judge is anything with `same_entity(pairs) -> [True | False | None]`; `None` means "cannot
tell" and, like no judge at all, keeps the pair apart (the conservative decision: a wrong
merge corrupts two entities, a missed one only leaves a duplicate). Judges register by name
in `JUDGES`; `resolve.adjudicator` in the config picks one. The embedded default has none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline.config import TkgConfig


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


JUDGES: dict[str, Callable[[TkgConfig], PairJudge]] = {}


def register_judge(name: str) -> Callable[[Callable[[TkgConfig], PairJudge]],
                                          Callable[[TkgConfig], PairJudge]]:
    def register(factory: Callable[[TkgConfig], PairJudge]) -> Callable[[TkgConfig], PairJudge]:
        JUDGES[name] = factory
        return factory

    return register


def build_judge(config: TkgConfig) -> PairJudge | None:
    name = config.resolve.adjudicator
    if name == "none":
        return None
    if name not in JUDGES:
        _load_plugins()
    if name not in JUDGES:
        raise ValueError(f"resolve.adjudicator {name!r} is not a known judge "
                         f"(known: none, {', '.join(sorted(JUDGES)) or 'no others'})")
    return JUDGES[name](config)


def _load_plugins() -> None:
    """Judges that live in optional packages register on import."""
    import importlib

    for module in ("tkg.pipeline.llm.judges",):
        try:
            importlib.import_module(module)
        except ImportError:
            continue


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
