"""The times a question names (`tkg.query.timewords`): exact windows, and ordinary words and
numbers that are no dates."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tkg.query.timewords import windows

NOW = datetime(2023, 10, 15, 12, tzinfo=UTC)


def days(found):
    return [(a.date().isoformat(), b.date().isoformat()) for a, b in found]


@pytest.mark.parametrize("question, expected", [
    ("What did Jolene sign up for on 6 September 2023?", [("2023-09-05", "2023-09-08")]),
    ("Who did Maria have dinner with on May 3, 2023?", [("2023-05-02", "2023-05-05")]),
    ("What news did Evan share on 9th December 2023?", [("2023-12-08", "2023-12-11")]),
    ("What did Dave open in May 2023?", [("2023-05-01", "2023-06-01")]),
    ("Which cities did Dave travel to in 2023?", [("2023-01-01", "2024-01-01")]),
    # a month without a year: the latest one up to now
    ("When did Melanie go camping in June?", [("2023-06-01", "2023-07-01")]),
    ("What did she do in December?", [("2022-12-01", "2023-01-01")]),
    ("Where did John go on a road trip last year?", [("2022-01-01", "2023-01-01")]),
    ("What happened last month?", [("2023-09-01", "2023-10-01")]),
    ("Who visited last week?", [("2023-10-01", "2023-10-15")]),
    ("What did he start two weeks ago?", [("2023-09-24", "2023-10-08")]),
    ("Where did Caroline move from 4 years ago?", [("2018-10-16", "2020-10-15")]),
    ("What did she buy yesterday?", [("2023-10-13", "2023-10-15")]),
    # "the last week of October 2023" is October 2023, not the week before now
    ("Where was Calvin in the last week of October 2023?", [("2023-10-01", "2023-11-01")]),
])
def test_windows(question, expected):
    assert days(windows(question, NOW)) == expected


@pytest.mark.parametrize("question", [
    "How long ago was Caroline's 18th birthday?",  # an ordinal is no date
    "What did she do on April 10?",  # a day without a year: too vague to favour
    "I may go to the gym.",  # "may" the verb
    "How many of the 2023 tickets are open?",  # a year not introduced as a time
    "Is 31 February 2023 a date?",  # not a day of the calendar
    "What does Ana do?",
])
def test_no_windows(question):
    assert windows(question, NOW) == []


def test_naive_now_is_utc():
    assert days(windows("in May 2023", NOW.replace(tzinfo=None))) == [
        ("2023-05-01", "2023-06-01")]


def test_month_arithmetic_wraps_the_year():
    january = datetime(2024, 1, 20, tzinfo=UTC)
    assert days(windows("What happened last month?", january)) == [("2023-12-01", "2024-01-01")]
    assert days(windows("in December 2023", january)) == [("2023-12-01", "2024-01-01")]
