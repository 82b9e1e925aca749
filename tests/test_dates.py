from datetime import UTC, datetime

import pytest
from tkg.pipeline.extract.dates import marks_end, resolve_date

T_REF = datetime(2024, 10, 15, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("two weeks ago", datetime(2024, 10, 1, 9, tzinfo=UTC)),
        ("last summer", datetime(2024, 6, 1, tzinfo=UTC)),
        ("next Thursday", datetime(2024, 10, 17, tzinfo=UTC)),
        ("in 2019", datetime(2019, 1, 1, tzinfo=UTC)),
        ("2019", datetime(2019, 1, 1, tzinfo=UTC)),
        ("on March 3rd", datetime(2024, 3, 3, tzinfo=UTC)),
        ("yesterday", datetime(2024, 10, 14, 9, tzinfo=UTC)),
        ("the 1990s", datetime(1990, 1, 1, tzinfo=UTC)),
        ("summer 2023", datetime(2023, 6, 1, tzinfo=UTC)),
        ("June 2024", datetime(2024, 6, 1, tzinfo=UTC)),
    ],
)
def test_phrases_resolve_against_reference_time(phrase, expected):
    assert resolve_date(phrase, T_REF) == expected


def test_last_summer_before_it_ended_means_the_year_before():
    assert resolve_date("last summer", datetime(2024, 7, 1, tzinfo=UTC)) == datetime(
        2023, 6, 1, tzinfo=UTC)


@pytest.mark.parametrize("phrase", ["now", "recently", "5", ""])
def test_vague_words_are_not_dates(phrase):
    assert resolve_date(phrase, T_REF) is None


def test_results_are_utc():
    assert resolve_date("May 5, 2023 3pm", T_REF).tzinfo == UTC


def test_end_markers():
    assert marks_end("until")
    assert not marks_end("since")


def test_sample_corpus_phrases(expected):
    """Every dated phrase written down with the corpus resolves to its stated day."""
    misses = []
    for case in expected["relative_dates"]:
        t_ref = datetime.fromisoformat(case["t_ref"])
        got = resolve_date(case["phrase"], t_ref, prefer=case.get("prefer", "current_period"))
        if got is None or got.date().isoformat() != case["resolved"]:
            misses.append((case["phrase"], case["t_ref"], got, case["resolved"]))
    assert not misses
