"""The times a question names itself ("in May 2023", "on 30 August, 2023", "last year",
"two weeks ago"), as valid-time windows, so a search can favour what happened then when the
caller gave no time filter of their own. Relative words count back from `now` (the latest
episode the caller may see, or the caller's as_of).

A small grammar of whole phrases, not a general date parser: dateparser's `search_dates` read
"18th birthday" and "April 10" as dates and cost about 1 ms a question; a phrase here needs a
month name, a four-digit year, or a unit of time with "last"/"ago", so ordinary words and
numbers never become dates.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from tkg.pipeline.extract.dates import add_months

Window = tuple[datetime, datetime]  # [start, end)

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = (r"(?:january|february|march|april|may|june|july|august|september|october|november"
          r"|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?")
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d{2}"
ABSOLUTE = re.compile(
    rf"\b(?:(?P<d1>{_DAY})(?:\s+of)?\s+(?P<m1>{_MONTH}),?\s+(?P<y1>{_YEAR})"
    rf"|(?P<m2>{_MONTH})\s+(?P<d2>{_DAY}),?\s+(?P<y2>{_YEAR})"
    rf"|(?P<m3>{_MONTH}),?\s+(?P<y3>{_YEAR})"
    rf"|(?:in|during|of|since|by|this|last)\s+(?P<m4>{_MONTH})(?!\s*\d)"
    rf"|(?:in|during|of|since|by)\s+(?P<y4>{_YEAR}))\b", re.IGNORECASE)
_COUNT = r"\d{1,2}|an?|one|two|three|four|five|six|seven|eight|nine|ten|(?:a\s+)?few|several"
RELATIVE = re.compile(
    rf"\b(?:(?:last|past|previous)\s+(?P<unit>year|month|week(?:end)?)(?!\s+of\b)"
    rf"|(?P<count>{_COUNT})\s+(?P<unit2>day|week|month|year)s?\s+ago"
    rf"|(?P<yesterday>yesterday))\b", re.IGNORECASE)
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
            "seven": 7, "eight": 8, "nine": 9, "ten": 10, "few": 3, "a few": 3, "several": 3}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
# A named day also covers the day before and the one after: a message about it is often
# stamped the evening before or the next morning in another time zone.
DAY_MARGIN = timedelta(days=1)


def windows(text: str, now: datetime) -> list[Window]:
    """The windows of valid time the question's own time words name, in UTC."""
    now = now if now.tzinfo else now.replace(tzinfo=UTC)
    found: list[Window] = []
    for match in ABSOLUTE.finditer(text):
        try:
            found.append(_absolute(match.groupdict(), now))
        except ValueError:  # "31 February": not a date
            continue
    for match in RELATIVE.finditer(text):
        found.append(_relative(match.groupdict(), now))
    return found


def _absolute(g: dict[str, str | None], now: datetime) -> Window:
    day, month, year = g["d1"] or g["d2"], g["m1"] or g["m2"] or g["m3"], g["y1"] or g["y2"]
    if day and month and year:
        start = datetime(int(year), _month(month), int(re.match(r"\d+", day).group()),
                         tzinfo=UTC)
        return start - DAY_MARGIN, start + timedelta(days=1) + DAY_MARGIN
    if g["m3"] and g["y3"]:
        return _month_window(int(g["y3"]), _month(g["m3"]))
    if g["m4"]:  # a month without a year: the latest one up to now
        month = _month(g["m4"])
        return _month_window(now.year if month <= now.month else now.year - 1, month)
    year = int(g["y4"] or 0)
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


def _relative(g: dict[str, str | None], now: datetime) -> Window:
    if g["yesterday"]:
        return now - timedelta(days=2), now
    if g["unit"]:
        unit = g["unit"].lower()
        if unit == "year":
            return datetime(now.year - 1, 1, 1, tzinfo=UTC), datetime(now.year, 1, 1, tzinfo=UTC)
        if unit == "month":
            last = add_months(datetime(now.year, now.month, 1, tzinfo=UTC), -1)
            return _month_window(last.year, last.month)
        return now - timedelta(days=14), now  # last week(end): the fortnight up to now
    count = g["count"].lower()
    number = _NUMBERS.get(" ".join(count.split())) or int(count)
    unit = _UNIT_DAYS[g["unit2"].lower()]
    centre = now - timedelta(days=unit * number)
    return centre - timedelta(days=unit), centre + timedelta(days=unit)


def _month(text: str) -> int:
    return _MONTHS.index(text.lower()[:3]) + 1


def _month_window(year: int, month: int) -> Window:
    start = datetime(year, month, 1, tzinfo=UTC)
    return start, add_months(start, 1)
