"""Resolve date expressions against an episode's reference time (t_ref), always in UTC.

dateparser handles most absolute and relative forms ("two weeks ago", "next Thursday",
"March 3rd"); a few rules in front of it cover what it gets wrong or cannot read: a bare year
means January 1st, decades ("the 1990s"), and seasons ("last summer").
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache

LEADING_WORDS = re.compile(
    r"^(?:on|in|at|since|from|by|during|around|about|circa|as of|early|late|mid|the)\s+", re.I
)
YEAR = re.compile(r"^(?:the year\s+)?(1[89]\d\d|2[01]\d\d)$")
DECADE = re.compile(r"^(?:the\s+)?(1[89]\d|20\d)0'?s$", re.I)
SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
SEASON = re.compile(
    r"^(?:(this|last|next|past)\s+)?(spring|summer|autumn|fall|winter)(?:\s+(?:of\s+)?(\d{4}))?$",
    re.I,
)
# Words that dateparser would read as a date but that do not pin down a time on their own.
VAGUE = {"now", "recently", "soon", "later", "lately", "once", "ever", "then", "these days"}
END_MARKERS = re.compile(r"^(?:until|till|til|through|up to|ending)\s+", re.I)


def _clean(text: str) -> str:
    text = " ".join(text.replace("’", "'").split()).strip(" ,.;:!?")
    previous = None
    while previous != text:
        previous = text
        text = LEADING_WORDS.sub("", text)
    return text


def _season(match: re.Match[str], t_ref: datetime) -> datetime:
    which, season, year = match.group(1), match.group(2).lower(), match.group(3)
    month = SEASONS[season]
    if year:
        return datetime(int(year), month, 1, tzinfo=UTC)
    this_year = datetime(t_ref.year, month, 1, tzinfo=UTC)
    if (which or "").lower() == "next":
        return this_year if this_year > t_ref else this_year.replace(year=t_ref.year + 1)
    if (which or "").lower() in ("last", "past"):
        # The most recent such season that ended (seasons last three months) before t_ref.
        end = add_months(this_year, 3)
        return this_year if end <= t_ref else this_year.replace(year=t_ref.year - 1)
    return this_year


def add_months(moment: datetime, months: int) -> datetime:
    """`moment` moved by whole calendar months (its day must exist in the target month)."""
    index = moment.month - 1 + months
    return moment.replace(year=moment.year + index // 12, month=index % 12 + 1)


@lru_cache(maxsize=65536)
def _resolve(text: str, t_ref: datetime, date_order: str, prefer: str) -> datetime | None:
    cleaned = _clean(text)
    if not cleaned or cleaned.lower() in VAGUE:
        return None
    if match := YEAR.match(cleaned):
        return datetime(int(match.group(1)), 1, 1, tzinfo=UTC)
    if match := DECADE.match(cleaned):
        return datetime(int(match.group(1)) * 10, 1, 1, tzinfo=UTC)
    if match := SEASON.match(cleaned):
        return _season(match, t_ref)
    if cleaned.isdigit():  # "5", "1990" handled above; bare numbers are not dates
        return None
    import dateparser  # (here: a search imports add_months, and dateparser costs ~50 ms)

    parsed = dateparser.parse(
        cleaned,
        languages=["en"],
        settings={
            "RELATIVE_BASE": t_ref.astimezone(UTC).replace(tzinfo=None),
            "PREFER_DAY_OF_MONTH": "first",
            "PREFER_DATES_FROM": prefer,
            "DATE_ORDER": date_order,
            "TIMEZONE": "UTC",
            "TO_TIMEZONE": "UTC",
            "RETURN_AS_TIMEZONE_AWARE": True,
        },
    )
    if parsed is None or not (1800 <= parsed.year <= 2200):
        return None
    return parsed.astimezone(UTC)


def resolve_date(
    text: str, t_ref: datetime, *, date_order: str = "MDY", prefer: str = "current_period"
) -> datetime | None:
    """The instant `text` refers to, relative to `t_ref`; None when it names no date."""
    return _resolve(text, t_ref, date_order, prefer)


def marks_end(preceding: str) -> bool:
    """True when the words before a date make it the end of a fact ("until May")."""
    return bool(END_MARKERS.match(preceding.strip() + " "))
