"""Names resolved as a reader would: a first or last name alone, a given name spelt another
way, an organisation without its generic head, a code without its type word and a nickname
merge with the one full name of their group they can mean, and stay apart when they could
mean two; each merge says why in `entity_aliases`."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from tkg.pipeline import schema
from tkg.pipeline.config import ResolveConfig
from tkg.pipeline.resolve import (
    blocking_keys,
    blocks_to_recompute,
    candidate_pairs,
    cluster,
    distinct_pairs,
    known_pairs,
    node_pairs,
    normalize_name,
    person_name_duplicates,
    sound_key,
)

CONFIG = ResolveConfig()
PERSON, ORG = ("Person",), ("Organization",)


def node(name: str, labels: tuple[str, ...] = PERSON, mentions: int = 1, group: str = "g",
         days: tuple[int, int] = (1, 28)) -> dict:
    return {"group_id": group, "normalized": normalize_name(name), "name": name,
            "labels": list(labels), "mention_count": mentions, "name_embedding": None,
            "first_seen": datetime(2024, 2, days[0], tzinfo=UTC),
            "last_seen": datetime(2024, 2, days[1], tzinfo=UTC)}


def _table(nodes: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{"attributes": None, **n} for n in nodes])


def resolved(nodes: list[dict], config: ResolveConfig = CONFIG) -> dict[str, tuple[str, str]]:
    """(root, evidence) of every name (group-qualified when the nodes span groups)."""
    table = _table(nodes)
    pairs = candidate_pairs(blocking_keys(table, config), config)
    mapping = cluster(pa.concat_tables([pairs, node_pairs(table)]))
    groups = {n["group_id"] for n in nodes}
    return {(r["normalized"] if len(groups) == 1 else f'{r["group_id"]}/{r["normalized"]}'):
            (r["root"], r["evidence"]) for r in mapping.to_pylist()}


def test_each_short_name_joins_the_one_full_name_it_can_mean():
    roots = resolved([
        node("Tania Tetlow", mentions=2), node("Tetlow", mentions=9),
        node("Stephen Dubner", mentions=3), node("Steven"),
        node("Fordham University", ORG, 2), node("Fordham", ORG, 4),
        node("Ticket T-23", ("Ticket",)), node("T-23", ("Entity",)),
        node("Melanie", mentions=40), node("Mel", mentions=12, days=(3, 20)),
    ])
    assert roots["tetlow"] == ("tania tetlow", "surname")
    assert roots["steven"] == ("stephen dubner", "given_name")
    assert roots["fordham"] == ("fordham university", "short_form")
    assert roots["t-23"] == ("ticket t-23", "code")
    assert roots["mel"] == ("melanie", "nickname")
    assert roots["tania tetlow"] == ("tania tetlow", "exact")


def test_a_short_name_that_could_mean_two_stays_apart():
    roots = resolved([
        node("Tania Tetlow"), node("Mark Tetlow"), node("Tetlow"),
        node("Stephen Dubner"), node("Steven Levitt"), node("Steven"),
        node("Fordham University", ORG), node("Fordham Hospital", ORG), node("Fordham", ORG),
        node("Ticket T-23", ("Ticket",)), node("Invoice T-23", ("Invoice",)), node("T-23"),
        node("Melanie"), node("Melissa Hart"), node("Mel"),
        node("Alice Walker"), node("Tom Alice"), node("Alice"),
    ])
    # Steven may be Steven Levitt or Stephen Dubner misspelt: two as well
    for short in ("tetlow", "fordham", "t-23", "mel", "alice", "steven"):
        assert roots[short] == (short, "exact"), short


def test_what_only_looks_alike_stays_apart():
    roots = resolved([
        node("Tom Smith"), node("Tim"),  # said alike, spelt too far apart
        node("Melanie", days=(1, 5)), node("Mel", days=(10, 12)),  # never in the same days
        node("Denzel Washington"), node("Washington", ("Location",)),  # a place
        node("Fordham Road", ("Location",)), node("Fordham Road Market", ORG),
        node("Sam Rivera"), node("sam"),  # lower case: a word, not a name
        node("Ada Byron"), node("Ada Byron Foundation", ORG),  # a person, not a short form
    ])
    assert roots["tim"] == ("tim", "exact")
    assert roots["mel"] == ("mel", "exact")
    assert roots["washington"] == ("washington", "exact")
    assert roots["fordham road"] == ("fordham road", "exact")
    assert roots["sam"] == ("sam", "exact")
    assert roots["ada byron"] == ("ada byron", "exact")


def test_a_nickname_is_the_start_of_a_given_name_of_three_letters_or_more():
    roots = resolved([node("Joanne Ward", mentions=5), node("Ann"), node("Jo"),
                      node("Christopher", mentions=7), node("Chris", mentions=30)])
    assert roots["ann"] == ("ann", "exact")  # inside Joanne, not its start
    assert roots["jo"] == ("jo", "exact")  # shorter than nickname_chars
    assert roots["chris"] == ("christopher", "nickname")  # said more, still not the name


def test_a_participant_is_not_the_short_form_of_a_stray_full_name():
    """A lone name said in far more episodes than the full name is a name of its own (a
    speaker, "Jon", and a greeting taken for a name, "Yep Jon")."""
    roots = resolved([node("Jon", mentions=197), node("Yep Jon"),
                      node("Tetlow", mentions=20), node("Tania Tetlow")])
    assert roots["jon"] == ("jon", "exact")
    assert roots["tetlow"] == ("tania tetlow", "surname")  # within short_name_ratio


def test_names_of_one_person_are_one_meaning_and_a_code_never_names_its_record():
    record = dict(node("Ticket T-17", ("Ticket",)), attributes='{"record": "Ticket T-17"}')
    roots = resolved([node("Ms. Rita Almeida"), node("Rita Almeida", mentions=3),
                      node("Ms. Almeida"), record, node("T-17", ("Product",), 6)])
    assert roots["ms almeida"][1] == "surname"  # two names of one core: one person
    assert roots["ms almeida"][0] == roots["rita almeida"][0] == roots["ms rita almeida"][0]
    # a record's key name names it only when nothing else does, but a bare code is no name
    assert roots["t-17"] == ("ticket t-17", "code")


def test_never_across_groups():
    roots = resolved([node("Tania Tetlow", group="g"), node("Tetlow", group="h"),
                      node("Melanie", group="g"), node("Mel", group="h")])
    assert roots["h/tetlow"] == ("tetlow", "exact")
    assert roots["h/mel"] == ("mel", "exact")


def test_the_rules_can_be_turned_off():
    off = CONFIG.model_copy(update={"short_names": False, "nickname_chars": 0})
    roots = resolved([node("Tania Tetlow"), node("Tetlow"), node("Melanie"), node("Mel")],
                     off)
    assert roots["tetlow"] == ("tetlow", "exact")
    assert roots["mel"] == ("mel", "exact")


def test_sound_keys_spell_alike_names_alike():
    assert sound_key("steven") == sound_key("stephen") == "stfn"
    assert sound_key("catherine") == sound_key("katherine")
    assert sound_key("jon") == sound_key("john")
    assert sound_key("tim") == sound_key("tom")  # the similarity threshold parts them
    assert sound_key("t-23") == "=t-23"


def test_person_name_duplicates_counts_what_a_reader_would_merge():
    entities = pa.Table.from_pylist([
        {"group_id": "g", "name": "Tania Tetlow", "labels": ["Person"]},
        {"group_id": "g", "name": "Tetlow", "labels": ["Person"]},
        {"group_id": "g", "name": "Alice Walker", "labels": ["Person"]},
        {"group_id": "g", "name": "Tom Alice", "labels": ["Person"]},
        {"group_id": "g", "name": "Alice", "labels": ["Person"]},  # could mean two
        {"group_id": "g", "name": "Fordham University", "labels": ["Organization"]},
        {"group_id": "g", "name": "Fordham", "labels": ["Person"]},  # not a person's word
        {"group_id": "h", "name": "Walker", "labels": ["Person"]},  # another group
        {"group_id": "g", "name": "Dr. Lee", "labels": ["Person"]},  # Lee: one word
        {"group_id": "g", "name": "Ann Lee", "labels": ["Person"]},
    ])
    assert person_name_duplicates(entities) == [
        ("g", "Dr. Lee", "Ann Lee"), ("g", "Tetlow", "Tania Tetlow")]


def _rows(pairs: pa.Table) -> list[tuple]:
    return sorted((p["group_id"], p["a"], p["b"], p["evidence"], p["merge"])
                  for p in pairs.to_pylist())


@pytest.mark.parametrize("tonight", [
    [node("Mark Tetlow")],  # Tetlow could now mean two: the stored merge is dropped
    [node("Tetlow", mentions=5)],  # more mentions of the short name: decided again, same
    [node("Melissa Hart"), node("Fordham Hospital", ORG)],
])
def test_a_later_run_decides_the_short_names_of_a_full_build(tonight):
    """Stored pairs + the blocks tonight's names fall in give the pairs of deciding every
    block: a rule over the whole group fits the blocking of a later run."""
    before = [node("Tania Tetlow"), node("Tetlow"), node("Melanie", mentions=9), node("Mel"),
              node("Fordham University", ORG), node("Fordham", ORG), node("Stephen Dubner"),
              node("Steven")]
    stored = candidate_pairs(blocking_keys(_table(before), CONFIG), CONFIG)
    names = {n["normalized"] for n in tonight}
    everyone = _table([n for n in before if n["normalized"] not in names] + tonight)
    keyed = blocking_keys(everyone, CONFIG)
    changed = pa.table({"group_id": ["g"] * len(tonight), "normalized": sorted(names)})
    kept, blocks = blocks_to_recompute(stored, keyed, changed)
    chosen = set(zip(blocks["group_id"].to_pylist(), blocks["key"].to_pylist(), strict=True))
    rows = keyed.filter(pa.array([(g, k) in chosen for g, k in zip(
        keyed["group_id"].to_pylist(), keyed["key"].to_pylist(), strict=True)]))
    repeated, new = known_pairs(candidate_pairs(rows, CONFIG), stored, names_table(changed))
    later = distinct_pairs(pa.concat_tables([kept, repeated, new]))
    assert _rows(later) == _rows(candidate_pairs(keyed, CONFIG))


def names_table(changed: pa.Table) -> pa.Table:
    return changed.cast(pa.schema([("group_id", pa.string()), ("normalized", pa.string())]))


def test_stored_pairs_schema_is_unchanged():
    """Short-name merges are ordinary resolution pairs: stores written before them read."""
    pairs = candidate_pairs(blocking_keys(_table([node("Tania Tetlow"), node("Tetlow")]),
                                          CONFIG), CONFIG)
    assert pairs.schema == schema.RESOLUTION_PAIRS


# --- one small real build -------------------------------------------------------------------

def _turn(number: int, speaker: str, content: str, group: str = "show") -> dict:
    return {"group_id": group, "id": f"{group}-{number}", "kind": "message",
            "timestamp": f"2024-03-01T10:{number:02d}:00Z", "conversation_id": f"{group}-1",
            "speaker": speaker, "content": content}


SHOW = (
    _turn(1, "Stephen Dubner", "Today my guest is Tania Tetlow, the president of Fordham "
          "University."),
    # a sentence-initial bare surname (spaCy: a common noun), a name as turn 1 writes it
    _turn(2, "Stephen Dubner", "Tetlow taught law at Tulane before she came to Fordham."),
    _turn(3, "Tania Tetlow", "I loved teaching at Tulane."),
    _turn(4, "Melanie", "Yesterday I filed Ticket T-23 about the projector."),
    _turn(5, "Stephen Dubner", "Steven here again: Fordham is in the Bronx."),
    _turn(6, "Caroline", "Did anyone fix T-23 yet?"),
    _turn(7, "Melanie", "Not yet, Caroline. Mel will ask again tomorrow."),
    _turn(8, "Ann Other", "Ms. Tetlow taught at Yale.", group="other"),  # another tenant's
)


def _write(folder, records) -> str:
    import json

    folder.mkdir(parents=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


def _aliases(result) -> list[tuple]:
    from tkg.pipeline import store

    with store.open_catalog(result.snapshot) as con:
        return sorted(con.execute(
            "SELECT a.group_id, a.alias, e.name, a.evidence FROM entity_aliases a "
            "JOIN entities e USING (entity_id)").fetchall())


def test_a_build_merges_short_names_and_says_why(ray_session, config, tmp_path):
    """Driver path, Ray Data (`ray.driver_mb` 0) and a later run on top of an earlier one
    publish the same aliases; each short name's alias row names its evidence, and "Where did
    Tania Tetlow teach law?" finds what Tetlow taught."""
    from tkg.pipeline.build import build

    from tkg import query

    on_ray = config.model_copy(update={"ray": config.ray.model_copy(update={"driver_mb": 0})})
    driver = build(config, [_write(tmp_path / "all", SHOW)], tmp_path / "driver")
    ray_data = build(on_ray, [_write(tmp_path / "all-ray", SHOW)], tmp_path / "ray")
    build(config, [_write(tmp_path / "first", SHOW[:3])], tmp_path / "later", run_id="a")
    later = build(config, [_write(tmp_path / "second", SHOW[3:])], tmp_path / "later",
                  run_id="b")
    aliases = _aliases(driver)
    assert aliases == _aliases(ray_data) == _aliases(later)
    merged = {(group, alias): (name, evidence) for group, alias, name, evidence in aliases}
    assert merged[("show", "Tetlow")] == ("Tania Tetlow", "surname")
    assert merged[("show", "Fordham")] == ("Fordham University", "short_form")
    assert merged[("show", "Steven")] == ("Stephen Dubner", "given_name")
    assert merged[("show", "T-23")] == ("Ticket T-23", "code")
    assert merged[("show", "Mel")] == ("Melanie", "nickname")
    assert merged[("other", "Tetlow")] == ("Tetlow", "exact")  # never across groups

    found = query.open(driver.summary["store"]).search(
        "Where did Tania Tetlow teach law?", ["show"])
    assert any("Tulane" in hit.fact and hit.source == "Tania Tetlow" for hit in found.facts)
