"""`tkg bench graph` at a tiny size (one LoCoMo session, the chinook records): every figure
it reports is there and holds what the data says; its generic-noun measure on names."""

from __future__ import annotations

import pytest

from tests.conftest import SHARED_DATA


def test_generic_nouns_are_names_of_common_words_only(config):
    from tkg.jobs.bench.graph import generic_flags
    from tkg.pipeline.extract.spacy_extractor import load_spacy

    names = ["news", "new job", "kids & work", "Covid", "T-23", "Riverside Elementary",
             "iPhone", "Caroline", "ticket 17"]
    assert generic_flags(names, load_spacy(config.extract.spacy_model)) == [
        True, True, True, False, False, False, False, False, False]


@pytest.mark.skipif(not (SHARED_DATA / "locomo10.json").is_file()
                    or not (SHARED_DATA / "chinook_fixture.json").is_file(),
                    reason="../shared/data is absent")
def test_bench_graph_tiny(ray_session, config, tmp_path_factory):
    """The bench's build and figures (shared with tests/test_records_chinook.py)."""
    from tests.graph_store import tiny_graph

    figures = tiny_graph(config, tmp_path_factory)
    assert figures["episodes"] > 0 and figures["build_seconds"] >= 0  # it built the store
    assert figures["parts"] == ["locomo", "chinook"]
    observed = figures["locomo_observations"]
    # conv-26's first session has 7 gold observations (Caroline 3, Melanie 4)
    assert observed["overall"]["observations"] == observed["conversation conv-26"][
        "observations"] == observed["extracted"]["observations"] == 7
    for row in (observed["overall"], observed["extracted"]):
        assert 0 <= row["recall@0.7"] <= row["recall@0.6"] <= row["coverage"] <= 1
    records = figures["chinook"]
    assert records["records"] == {"Customer": 59, "Employee": 8, "Invoice": 412}
    edges = records["reference_edges"]
    assert {k: edges[k]["expected"] for k in ("overall", "REPORTS_TO", "SUPPORT_REP",
                                              "CUSTOMER")} == {
        "overall": 478, "REPORTS_TO": 7, "SUPPORT_REP": 59, "CUSTOMER": 412}
    assert set(records) >= {"record_entities", "attribute_only_entities", "entities"}
    assert set(figures["generic_nouns"]) == {"locomo"}
    assert figures["generic_nouns"]["locomo"]["entities"] > 0
    assert 0 <= figures["generic_nouns"]["locomo"]["share"] <= 1
    assert set(figures["person_duplicates"]) == {"locomo", "chinook"}
    assert figures["person_duplicates"]["locomo"]["person_names"] >= 2  # the two speakers
