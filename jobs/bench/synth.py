"""Synthetic episodes for ``tkg bench build --episodes N``.

Generates input records that follow the input contract (README, "Input"): about 70 %
chat messages, 20 % JSON business records and 10 % short text notes, spread over several
groups (tenants). Each group has its own cast of people, companies, cities and products
whose state (employer, city, title, headquarters) evolves over a two-year timeline, so the
same names recur across many episodes and some facts are later contradicted.

Stdlib only and fully deterministic: the same ``(n, seed, groups)`` gives the same records.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from string import Formatter
from typing import Any

__all__ = ["generate_episodes", "write_jsonl"]

# --------------------------------------------------------------------------- vocabulary

# fmt: off
FIRST_NAMES = (
    "Alice", "Aaron", "Amara", "Andre", "Anita", "Ben", "Bianca", "Carlos", "Chen", "Chloe",
    "Daniel", "Dana", "Diego", "Elena", "Emeka", "Emma", "Farah", "Felix", "Fiona", "Gabriel",
    "Grace", "Hana", "Hugo", "Ibrahim", "Ingrid", "Isaac", "Jamal", "Jana", "Jasmine", "Javier",
    "Julia", "Kai", "Karen", "Kenji", "Laila", "Lars", "Leo", "Lucia", "Maya", "Marco", "Mei",
    "Miguel", "Nadia", "Naveen", "Nina", "Noah", "Olivia", "Omar", "Oscar", "Priya", "Paolo",
    "Quinn", "Rafael", "Rosa", "Ravi", "Sara", "Samuel", "Sofia", "Sven", "Tara", "Thomas",
    "Tomas", "Uma", "Victor", "Vera", "Wei", "William", "Xavier", "Yara", "Yusuf", "Zoe", "Zara",
    "Hannah", "Ethan", "Mila", "Arjun", "Leila", "Mateo", "Ines", "Jonas", "Freya", "Kofi",
    "Aisha", "Lukas", "Greta", "Rohan",
)
LAST_NAMES = (
    "Smith", "Johnson", "Garcia", "Müller", "Nguyen", "Patel", "Kim", "Rossi", "Silva", "Novak",
    "Kowalski", "Andersen", "Okafor", "Tanaka", "Ivanova", "Haddad", "Schmidt", "Dubois", "Moreau",
    "Lopez", "Martinez", "Fischer", "Weber", "Jensen", "Larsen", "Costa", "Santos", "Romano",
    "Bianchi", "Yamamoto", "Sato", "Chen", "Wang", "Singh", "Kumar", "Shah", "Mensah", "Adeyemi",
    "Brown", "Taylor", "Wilson", "Clarke", "Walker", "Hughes", "Murphy", "Kelly", "Ryan", "Byrne",
    "Novotny", "Horvat", "Nagy", "Popescu", "Petrov", "Hansen", "Berg", "Lindqvist", "Nieminen",
    "Virtanen", "Bauer", "Wagner", "Becker", "Hoffmann", "Schulz", "Keller", "Fontaine", "Laurent",
    "Mercier", "Ortega", "Navarro", "Reyes", "Morales", "Castillo", "Vargas", "Herrera", "Ahmed",
    "Hassan", "Rahman", "Cohen", "Levy", "Friedman", "Park", "Choi",
)
COMPANY_STEMS = (
    "Acme", "Northwind", "Contoso", "Globex", "Initech", "Umbrella", "Stark", "Wayne", "Wonka",
    "Hooli", "Vandelay", "Tyrell", "Cyberdyne", "Soylent", "Aperture", "Massive", "Pied Piper",
    "Blue Harbor", "Redwood", "Silverline", "Brightpath", "Ironclad", "Lumen", "Nimbus", "Orbital",
    "Pinnacle", "Quantum", "Riverside", "Summit", "Tidewater", "Evergreen", "Keystone",
    "Lighthouse", "Meridian", "Northstar", "Oakridge", "Polaris", "Sterling", "Vertex", "Granite",
    "Cobalt", "Falcon", "Horizon", "Juniper", "Maple", "Obsidian", "Sapphire", "Willow", "Atlas",
    "Beacon", "Cascade", "Driftwood", "Ember", "Frontier", "Halcyon", "Kestrel", "Mosaic",
    "Prairie", "Quartz", "Solstice",
)
COMPANY_SUFFIXES = (
    "Inc", "Labs", "Logistics", "Systems", "Analytics", "Foods", "Energy", "Health", "Capital",
    "Robotics", "Media", "Partners", "Software", "Group", "Bank", "Retail",
)
CITIES = (
    ("Berlin", "Germany"), ("Munich", "Germany"), ("Hamburg", "Germany"), ("Paris", "France"),
    ("Lyon", "France"), ("Madrid", "Spain"), ("Barcelona", "Spain"), ("Lisbon", "Portugal"),
    ("Porto", "Portugal"), ("Rome", "Italy"), ("Milan", "Italy"), ("Amsterdam", "Netherlands"),
    ("Rotterdam", "Netherlands"), ("Brussels", "Belgium"), ("Vienna", "Austria"),
    ("Zurich", "Switzerland"), ("Geneva", "Switzerland"), ("Copenhagen", "Denmark"),
    ("Stockholm", "Sweden"), ("Oslo", "Norway"), ("Helsinki", "Finland"), ("Warsaw", "Poland"),
    ("Prague", "Czechia"), ("Budapest", "Hungary"), ("Dublin", "Ireland"),
    ("London", "United Kingdom"), ("Manchester", "United Kingdom"),
    ("Edinburgh", "United Kingdom"), ("New York", "United States"), ("Boston", "United States"),
    ("Chicago", "United States"), ("Denver", "United States"), ("Austin", "United States"),
    ("Seattle", "United States"), ("San Francisco", "United States"),
    ("Los Angeles", "United States"), ("Atlanta", "United States"), ("Toronto", "Canada"),
    ("Vancouver", "Canada"), ("Montreal", "Canada"), ("Mexico City", "Mexico"),
    ("Sao Paulo", "Brazil"), ("Buenos Aires", "Argentina"), ("Bogota", "Colombia"),
    ("Lagos", "Nigeria"), ("Nairobi", "Kenya"), ("Cape Town", "South Africa"), ("Cairo", "Egypt"),
    ("Dubai", "United Arab Emirates"), ("Mumbai", "India"), ("Bangalore", "India"),
    ("Singapore", "Singapore"), ("Tokyo", "Japan"), ("Osaka", "Japan"), ("Seoul", "South Korea"),
    ("Sydney", "Australia"), ("Melbourne", "Australia"), ("Auckland", "New Zealand"),
    ("Tel Aviv", "Israel"), ("Istanbul", "Turkey"),
)
PRODUCT_STEMS = (
    "Atlas", "Beacon", "Comet", "Delta", "Echo", "Fusion", "Galaxy", "Helix", "Ion", "Jade",
    "Kite", "Lumen", "Matrix", "Nova", "Onyx", "Pulse", "Quill", "Radar", "Sierra", "Titan",
    "Vector", "Zephyr", "Orbit", "Prism", "Spark",
)
PRODUCT_NOUNS = (
    "CRM", "Analytics", "Cloud", "Pay", "Insights", "Sync", "Desk", "Vault", "Connect", "Studio",
    "Forecast", "Ledger",
)
TITLES = (
    "account executive", "engineering manager", "head of sales", "product manager",
    "data scientist", "CFO", "CTO", "VP of marketing", "operations lead", "designer",
    "customer success manager", "procurement lead", "software engineer", "COO", "general counsel",
    "head of partnerships", "support lead", "analyst", "marketing director", "office manager",
)
TEAMS = (
    "sales", "marketing", "data", "platform", "finance", "support", "design", "legal",
    "partnerships", "security",
)
INDUSTRIES = (
    "logistics", "retail", "healthcare", "fintech", "manufacturing", "media", "energy",
    "education", "hospitality", "insurance", "automotive", "telecom",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
WEEKDAYS = (
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
)
STREETS = (
    "Main Street", "Harbor Road", "Market Square", "Station Avenue", "Park Lane", "Mill Road",
    "Church Street", "King Street", "Lake View", "Oak Avenue",
)
# fmt: on

# --------------------------------------------------------------------------- templates
# Each template: (format string, effect or None). Field names are resolved by
# ``_Filler``; effects update the group's world state after the sentence is written.

SELF_FACTS: tuple[tuple[str, str | None], ...] = (
    ("I work at {company} now.", "self_company"),
    ("I just started a new job at {company} as {title_a}.", "self_company_title"),
    ("I moved to {city} last summer.", "self_city"),
    ("I've been living in {my_city} for about {count} years now.", None),
    ("My manager at {my_company} is {person}.", None),
    ("I had lunch with {person} in {city} yesterday.", None),
    ("I'm flying to {city} next {weekday} to meet {person}.", None),
    ("I left {my_company} in {month} and joined {company}.", "self_company"),
    ("My friend {person} just bought a house in {city}.", "city"),
    ("I'm still using {product} for all our reporting at {my_company}.", None),
    ("I was born in {my_birthplace}, but I grew up in {city}.", None),
    ("I finally met {person} from {person_company} in person.", None),
)
FACTS: tuple[tuple[str, str | None], ...] = (
    ("{person} moved to {city} last summer.", "city"),
    ("{person} joined {company} in {month} {year}.", "company"),
    ("{person} manages the {product} account.", None),
    ("{person} no longer works at {person_company}.", "left"),
    ("{person} is the new {title} at {company}.", "company_title"),
    ("{person} works as {person_title_a} at {person_company}.", None),
    ("{person} lives in {person_city} with their two kids.", None),
    ("{person} reports to {person2} now.", None),
    ("{person} and {person2} are leading the {product} launch.", None),
    ("{person} was promoted to {title} in {month}.", "title"),
    ("{company} acquired {company2} for {amount}.", None),
    ("{company} opened a new office in {city}.", None),
    ("{company} is headquartered in {company_hq}.", None),
    ("{company} moved its headquarters to {city} in {month} {year}.", "hq"),
    ("We signed a contract with {company} two weeks ago.", None),
    ("We lost the {company} deal to {company2} last month.", None),
    ("{company} renewed their {product} subscription for another year.", None),
    ("{company} cancelled their {product} subscription in {month}.", None),
    ("{person} is good friends with {person2}.", None),
    ("{person} went to college in {city} with {person2}.", None),
    ("{person} is leaving {person_company} at the end of {month}.", None),
    ("{person} started a new role as {title_a} at {company}.", "company_title"),
    ("{company} hired {person} as their new {title}.", "company_title"),
    ("{person} will present the {product} roadmap in {city} next {weekday}.", None),
    ("{person} closed a {amount} deal with {company} last quarter.", None),
    ("{company} has been a customer of {home} since {year}.", None),
    ("{person} is the main point of contact at {person_company}.", None),
    ("{person} complained that {product} keeps crashing during exports.", None),
    ("{person} visited the {company} office in {city} on {weekday}.", None),
    ("The {team} team at {home} now reports to {person}.", None),
    ("{person} bought {count} licenses of {product} for {person_company}.", None),
    ("{person} was born in {person_birthplace}.", None),
    ("{company} partnered with {company2} on the {product} integration.", None),
    ("{person} is taking over the {company} account from {person2}.", None),
    ("{person} has been the {person_title} at {person_company} since {year}.", None),
    ("{person} relocated from {person_city} to {city} in {month}.", "city"),
    ("{company} raised its prices for {product} by {count} percent.", None),
    ("{person} retired from {person_company} last {month}.", "left"),
    ("The {team} team shipped the new {product} release on {weekday}.", None),
    ("We hired {person} from {person_company} as our new {title}.", "hired"),
    ("{person} is moving to {city} next month.", "city"),
    ("{company} signed a {amount} contract with {home} in {month}.", None),
    ("{person} introduced me to {person2} at the conference in {city}.", None),
    ("{company} uses {product} across all of their {industry} sites.", None),
)
QUESTIONS: tuple[tuple[str, str | None], ...] = (
    ("Can you remind me to call {person} next {weekday}?", None),
    (
        "Do you know where {person} works these days?",
        "{person} works at {person_company} now, I think.",
    ),
    ("Where is {person} living now?", "{person} lives in {person_city} these days."),
    (
        "Did {person} ever get back to you about {product}?",
        "Not yet, I will ping {first} again tomorrow.",
    ),
    (
        "Is {company} still using {product} for their team?",
        "Yes, {company} renewed {product} in {month}.",
    ),
    ("Who is the main contact at {company} now?", "{person} is the main contact at {company} now."),
    (
        "When did {person} join {person_company} again?",
        "{person} joined {person_company} in {month} {year}.",
    ),
    ("Could you send me the latest numbers for {company}?", None),
    ("Should we invite {person} to the {product} demo?", None),
    ("What time is the call with {company} on {weekday}?", None),
    ("Have you heard anything from {person2} since the offsite?", None),
    ("Can you book a table in {city} for {count} people?", None),
    ("Where is {company} headquartered these days?", "{company} is headquartered in {company_hq}."),
    ("What does {person} do at {person_company}?", "{first} works as {person_title_a} there."),
)
SMALL_TALK: tuple[str, ...] = (
    "Sounds good, thanks a lot!",
    "Great, talk to you soon then.",
    "Haha, that is so true.",
    "Ok, I will take a look tomorrow.",
    "Thanks for the quick update!",
    "No worries at all, take your time.",
    "Let me check and get back to you.",
    "That makes sense to me, thanks.",
    "Perfect, I will add it to my calendar.",
    "Good morning! How was your weekend?",
    "I am running a bit late today.",
    "Can we move this to next week?",
    "Awesome, really appreciate the help here.",
    "Sure thing, I will handle it.",
    "Honestly I have no idea, sorry.",
    "Got it, thanks for letting me know.",
    "Have a great weekend, everyone!",
    "Yes, that works for me.",
    "Let us sync again on {weekday}.",
    "It was great catching up today.",
    "Oh nice, I did not know that!",
    "Hmm, let me think about it.",
)
NOTE_TITLES: tuple[str, ...] = (
    "Meeting notes: {company}",
    "Call with {person}",
    "Weekly update from the {team} team",
    "Q{quarter} planning memo",
    "{product} rollout notes",
    "Account review: {company}",
    "Trip report: {city}",
    "Hiring update",
)
NOTE_OPENERS: tuple[str, ...] = (
    "Notes from the {company} meeting in {city}.",
    "Quick summary of the call with {person} on {weekday}.",
    "This memo summarizes where the {team} team stands.",
    "Short recap of the {product} review.",
    "Status update for the {company} account.",
)

MESSAGE_SOURCES = (
    "Slack #sales",
    "Slack #general",
    "support chat",
    "WhatsApp export",
    "Teams chat",
    "email thread",
)
JSON_SOURCE_DESCRIPTIONS = {
    "crm.customers": "Salesforce nightly export",
    "crm.contacts": "HubSpot contacts sync",
    "sales.orders": "ERP order feed",
    "support.tickets": "Zendesk ticket export",
}
TEXT_SOURCES = ("Notion page", "Google Docs memo", "meeting notes", "Confluence page")

_FORMATTER = Formatter()


def _compile(fmt: str) -> tuple[str, tuple[str, ...]]:
    """Return the format string with its field names, in order of appearance."""
    fields = tuple(dict.fromkeys(f for _, f, _, _ in _FORMATTER.parse(fmt) if f))
    return fmt, fields


_SELF = [(*_compile(f), e) for f, e in SELF_FACTS]
_FACTS = [(*_compile(f), e) for f, e in FACTS]
_QUESTIONS = [(*_compile(q), _compile(a) if a else None) for q, a in QUESTIONS]
_SMALL = [_compile(s) for s in SMALL_TALK]
_TITLES = [_compile(t) for t in NOTE_TITLES]
_OPENERS = [_compile(t) for t in NOTE_OPENERS]

EPOCH = datetime(2023, 1, 1)
SPAN_DAYS = 730
_JSON_SOURCES = ("crm.customers", "crm.contacts", "sales.orders", "support.tickets")
_JSON_WEIGHTS = (0.2, 0.25, 0.3, 0.25)


def _article(word: str) -> str:
    """``word`` with its indefinite article."""
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def _cum(weights: Iterable[float]) -> list[float]:
    out, total = [], 0.0
    for w in weights:
        total += w
        out.append(total)
    return out


# --------------------------------------------------------------------------- world state


class _Person:
    __slots__ = (
        "birthplace",
        "city",
        "company",
        "contact_id",
        "email_user",
        "first",
        "name",
        "staff",
        "title",
    )

    def __init__(
        self,
        name: str,
        first: str,
        company: int,
        city: str,
        title: str,
        birthplace: str,
        staff: bool,
        contact_id: str,
    ) -> None:
        self.name, self.first, self.company, self.city = name, first, company, city
        self.title, self.birthplace, self.staff = title, birthplace, staff
        self.contact_id = contact_id
        self.email_user = name.lower().replace(" ", ".").replace("ü", "ue")


class _Company:
    __slots__ = ("customer_id", "domain", "hq", "industry", "name", "revenue", "since")

    def __init__(
        self, name: str, hq: str, industry: str, customer_id: str, since: str, revenue: int
    ) -> None:
        self.name, self.hq, self.industry = name, hq, industry
        self.customer_id, self.since, self.revenue = customer_id, since, revenue
        self.domain = "".join(c for c in name.lower() if c.isalnum()) + ".com"


class _Group:
    """One tenant: its cast, its evolving world state and its id counters."""

    def __init__(self, index: int, seed: int) -> None:
        rng = random.Random(f"tkg-synth:{seed}:{index}:cast")
        self.group_id = f"tenant-{index}"
        n_people = rng.randint(30, 80)
        n_companies = rng.randint(15, 40)
        names: list[tuple[str, str]] = []
        seen: set[str] = set()
        while len(names) < n_companies + 1:
            stem = rng.choice(COMPANY_STEMS)
            name = f"{stem} {rng.choice(COMPANY_SUFFIXES)}"
            if stem not in seen:
                seen.add(stem)
                names.append((stem, name))
        self.cities: list[tuple[str, str]] = rng.sample(CITIES, rng.randint(10, 20))
        self.country = dict(CITIES)
        city_names = [c for c, _ in self.cities]
        self.city_names = city_names
        # Index 0 is the tenant's own company ("home"); the others are its customers.
        cust_ids = rng.sample(range(10000, 100000), len(names))
        self.companies = [
            _Company(
                name,
                rng.choice(city_names),
                rng.choice(INDUSTRIES),
                f"CUST-{cust_id}",
                f"{2015 + rng.randint(0, 7)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                rng.randint(5, 900) * 100_000,
            )
            for (_, name), cust_id in zip(names, cust_ids, strict=True)
        ]
        self.home = self.companies[0].name
        stems = rng.sample(PRODUCT_STEMS, rng.randint(6, 14))
        self.products = [f"{s} {rng.choice(PRODUCT_NOUNS)}" for s in stems]
        self.skus = {p: f"SKU-{rng.randint(100, 999)}-{i:02d}" for i, p in enumerate(self.products)}
        self.prices = {p: rng.randint(2, 400) * 25 for p in self.products}
        full: set[str] = set()
        self.people: list[_Person] = []
        while len(self.people) < n_people:
            first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
            name = f"{first} {last}"
            if name in full:
                continue
            full.add(name)
            staff = rng.random() < 0.3
            company = 0 if staff else rng.randrange(1, len(self.companies))
            self.people.append(
                _Person(
                    name,
                    first,
                    company,
                    rng.choice(city_names),
                    rng.choice(TITLES),
                    rng.choice(CITIES)[0],
                    staff,
                    f"CON-{len(self.people) + 1:05d}",
                )
            )
        self.staff = [p for p in self.people if p.staff] or self.people[:1]
        self.contacts = [p for p in self.people if not p.staff] or self.people
        # Zipf-like popularity: a few people and companies come up far more often.
        self.person_cw = _cum(1.0 / (i + 1) ** 0.8 for i in range(len(self.people)))
        self.company_cw = _cum(1.0 / (i + 1) ** 0.8 for i in range(len(self.companies)))
        self.contact_cw = _cum(1.0 / (i + 1) ** 0.7 for i in range(len(self.contacts)))
        self.counters: dict[str, int] = {}
        self.open_tickets: list[dict[str, Any]] = []
        self.open_orders: list[dict[str, Any]] = []

    def next_id(self, prefix: str) -> str:
        """Next sequential id for ``prefix``, unique within the group."""
        k = self.counters.get(prefix, 0) + 1
        self.counters[prefix] = k
        return f"{prefix}-{k:06d}"


class _Filler:
    """Fills template fields from a group's cast and state at one moment."""

    def __init__(self, group: _Group, rng: random.Random) -> None:
        self.g, self.rng = group, rng
        self.when = EPOCH
        self.speaker: _Person | None = None
        self.others: list[_Person] = []

    def person(self, exclude: tuple[_Person | None, ...] = ()) -> _Person:
        g, rng = self.g, self.rng
        for _ in range(8):
            p = rng.choices(g.people, cum_weights=g.person_cw)[0]
            if p not in exclude:
                return p
        return p

    def company(self, exclude: tuple[int, ...] = ()) -> int:
        g, rng = self.g, self.rng
        for _ in range(8):
            c = rng.choices(range(len(g.companies)), cum_weights=g.company_cw)[0]
            if c not in exclude:
                return c
        return c

    def fill(
        self, fmt: str, fields: tuple[str, ...], chosen: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Format ``fmt``; ``chosen`` carries entities over (e.g. question -> answer)."""
        g, rng = self.g, self.rng
        ch: dict[str, Any] = dict(chosen) if chosen else {}
        vals: dict[str, str] = {}
        me = self.speaker
        for f in fields:
            if f.startswith("person") or f == "first":
                if "person" not in ch:
                    ch["person"] = self.person((me,))
                p: _Person = ch["person"]
                if f == "person":
                    v = p.name
                elif f == "first":
                    v = p.first
                elif f == "person2":
                    if "person2" not in ch:
                        ch["person2"] = self.person((me, p))
                    v = ch["person2"].name
                elif f == "person_company":
                    v = g.companies[p.company].name
                elif f == "person_city":
                    v = p.city
                elif f == "person_title":
                    v = p.title
                elif f == "person_title_a":
                    v = _article(p.title)
                else:  # person_birthplace
                    v = p.birthplace
            elif f in ("company", "company_hq"):
                if "company" not in ch:
                    ch["company"] = self.company((0, me.company) if me else (0,))
                c = g.companies[ch["company"]]
                v = c.name if f == "company" else c.hq
            elif f == "company2":
                if "company2" not in ch:
                    ch["company2"] = self.company((ch.get("company", -1),))
                v = g.companies[ch["company2"]].name
            elif f == "city":
                if "city" not in ch:
                    ch["city"] = rng.choice(g.city_names)
                v = ch["city"]
            elif f == "product":
                if "product" not in ch:
                    ch["product"] = rng.choice(g.products)
                v = ch["product"]
            elif f in ("title", "title_a"):
                if "title" not in ch:
                    ch["title"] = rng.choice(TITLES)
                v = ch["title"] if f == "title" else _article(ch["title"])
            elif f == "month":
                if "month" not in ch:
                    ch["month"] = rng.randrange(12)
                v = MONTHS[ch["month"]]
            elif f == "year":
                if "year" not in ch:
                    year = self.when.year - rng.randint(0, 3)
                    # A past date: this year's months only up to the current one.
                    if year == self.when.year and ch.get("month", 0) >= self.when.month:
                        year -= 1
                    ch["year"] = year
                v = str(ch["year"])
            elif f == "weekday":
                v = rng.choice(WEEKDAYS)
            elif f == "amount":
                r = rng.random()
                if r < 0.4:
                    v = f"${rng.randint(2, 900) * 1000:,}"
                elif r < 0.75:
                    v = f"${rng.randint(1, 40)} million"
                else:
                    v = f"€{rng.randint(5, 500)}k"
            elif f == "count":
                v = str(rng.randint(2, 25))
            elif f == "team":
                v = rng.choice(TEAMS)
            elif f == "industry":
                v = rng.choice(INDUSTRIES)
            elif f == "home":
                v = g.home
            elif f == "quarter":
                v = str(rng.randint(1, 4))
            elif f == "my_company":
                v = g.companies[me.company].name if me else g.home
            elif f == "my_city":
                v = me.city if me else g.city_names[0]
            elif f == "my_birthplace":
                v = me.birthplace if me else g.city_names[0]
            else:  # pragma: no cover - a template with an unknown field
                raise KeyError(f)
            vals[f] = v
        return fmt.format_map(vals), ch

    def apply(self, effect: str | None, ch: dict[str, Any]) -> None:
        """Update the world state after a fact sentence (so later facts follow it)."""
        if effect is None:
            return
        me, g = self.speaker, self.g
        p: _Person | None = ch.get("person")
        if effect == "self_company" and me is not None:
            me.company = ch["company"]
        elif effect == "self_company_title" and me is not None:
            me.company, me.title = ch["company"], ch["title"]
        elif effect == "self_city" and me is not None:
            me.city = ch["city"]
        elif p is None:
            return
        elif effect == "city":
            p.city = ch["city"]
        elif effect == "company":
            p.company = ch["company"]
        elif effect == "company_title":
            p.company, p.title = ch["company"], ch["title"]
        elif effect == "title":
            p.title = ch["title"]
        elif effect == "left":
            p.company = self.company((p.company, 0))
        elif effect == "hired":
            p.company, p.title = 0, ch["title"]
        elif effect == "hq" and "company" in ch:
            g.companies[ch["company"]].hq = ch["city"]


# --------------------------------------------------------------------------- records


def _ts(sec: int) -> str:
    return (EPOCH + timedelta(seconds=sec)).isoformat() + "Z"


def _day(sec: int) -> str:
    return (EPOCH + timedelta(seconds=sec)).date().isoformat()


def _message_text(
    fl: _Filler, pending: tuple[tuple[str, tuple[str, ...]], dict[str, Any]] | None
) -> tuple[str, Any]:
    """One chat message: facts, questions, small talk, sometimes several sentences."""
    rng = fl.rng
    parts: list[str] = []
    follow = None
    if pending is not None and rng.random() < 0.6:
        (fmt, fields), ch = pending
        text, _ = fl.fill(fmt, fields, ch)
        parts.append(text)
    n_sent = 1 + (rng.random() < 0.3) + (rng.random() < 0.08)
    words = sum(len(s.split()) for s in parts)
    while len(parts) < n_sent or not parts:
        r = rng.random()
        effect: str | None = None
        answer = None
        if r < 0.16:
            fmt, fields, effect = rng.choice(_SELF)
        elif r < 0.58:
            fmt, fields, effect = rng.choice(_FACTS)
        elif r < 0.75:
            fmt, fields, answer = rng.choice(_QUESTIONS)
        else:
            fmt, fields = rng.choice(_SMALL)
        text, ch = fl.fill(fmt, fields)
        w = len(text.split())
        if parts and words + w > 40:
            break
        parts.append(text)
        words += w
        fl.apply(effect, ch)
        if r >= 0.58 and r < 0.75:  # a question ends the message
            if answer is not None:
                follow = (answer, ch)
            break
    return " ".join(parts), follow


def _session(
    g: _Group,
    fl: _Filler,
    start: int,
    length: int,
    records: list[tuple[int, int, int, dict[str, Any]]],
    gi: int,
) -> None:
    """Append one conversation of ``length`` messages starting at ``start``."""
    rng = fl.rng
    k = 2 if rng.random() < 0.7 else 3
    speakers: list[_Person] = []
    while len(speakers) < k:
        p = fl.person(tuple(speakers))
        if p not in speakers:
            speakers.append(p)
    conv = f"{g.group_id}-conv-{g.counters.get('conv', 0) + 1:05d}"
    g.counters["conv"] = g.counters.get("conv", 0) + 1
    desc = rng.choice(MESSAGE_SOURCES) if rng.random() < 0.5 else None
    sec = start
    cur = 0
    pending = None
    fl.when = EPOCH + timedelta(seconds=start)
    for i in range(length):
        if i:
            sec += rng.randint(60, 300)
            if rng.random() < 0.85 or pending is not None:
                cur = (cur + rng.randrange(1, k)) % k
        sp = speakers[cur]
        fl.speaker = sp
        text, nxt = _message_text(fl, pending)
        pending = nxt
        rec: dict[str, Any] = {
            "group_id": g.group_id,
            "id": g.next_id("msg"),
            "kind": "message",
            "timestamp": _ts(sec),
            "conversation_id": conv,
            "speaker": sp.name,
            "role": "user" if cur == 0 else "assistant",
            "content": text,
        }
        if desc:
            rec["source_description"] = desc
        records.append((sec, gi, len(records), rec))


def _json_record(g: _Group, fl: _Filler, sec: int) -> dict[str, Any]:
    """One business record from a CRM / sales / support feed."""
    rng = fl.rng
    source = rng.choices(_JSON_SOURCES, cum_weights=_cum(_JSON_WEIGHTS))[0]
    contact = rng.choices(g.contacts, cum_weights=g.contact_cw)[0]
    comp = g.companies[contact.company]
    staff = rng.choice(g.staff)
    data: dict[str, Any]
    if source == "crm.customers":
        c = g.companies[fl.company((0,))]
        data = {
            "customer_id": c.customer_id,
            "name": c.name,
            "industry": c.industry,
            "city": c.hq,
            "status": rng.choice(("active", "active", "active", "prospect", "churned", "on_hold")),
            "account_manager": staff.name,
            "annual_revenue": c.revenue,
            "created": c.since,
        }
        if rng.random() < 0.4:
            data["address"] = {
                "street": f"{rng.randint(1, 240)} {rng.choice(STREETS)}",
                "city": c.hq,
                "postal_code": f"{rng.randint(1000, 99999)}",
                "country": g.country[c.hq],
            }
        if rng.random() < 0.3:
            data["tags"] = rng.sample(
                ("enterprise", "smb", "priority", "renewal-due", "upsell", "at-risk", "partner"),
                rng.randint(1, 3),
            )
    elif source == "crm.contacts":
        data = {
            "contact_id": contact.contact_id,
            "name": contact.name,
            "email": f"{contact.email_user}@{comp.domain}",
            "company": comp.name,
            "customer_id": comp.customer_id,
            "title": contact.title,
            "city": contact.city,
            "status": "active" if rng.random() < 0.85 else "inactive",
            "owner": staff.name,
            "last_contacted": _day(sec - rng.randint(0, 60) * 86400),
        }
        if rng.random() < 0.3:
            data["phone"] = f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    elif source == "sales.orders":
        if g.open_orders and rng.random() < 0.3:
            data = dict(g.open_orders.pop(rng.randrange(len(g.open_orders))))
            data["status"] = rng.choice(("shipped", "delivered", "cancelled", "refunded"))
            data["updated_at"] = _ts(sec)
        else:
            n_items = rng.randint(1, 4)
            items = []
            for prod in rng.sample(g.products, min(n_items, len(g.products))):
                items.append(
                    {
                        "sku": g.skus[prod],
                        "product": prod,
                        "quantity": rng.randint(1, 50),
                        "unit_price": g.prices[prod],
                    }
                )
            data = {
                "order_id": f"SO-{_day(sec)[:4]}-{g.next_id('order')[-6:]}",
                "customer_id": comp.customer_id,
                "company": comp.name,
                "contact_name": contact.name,
                "sales_rep": staff.name,
                "order_date": _day(sec),
                "status": "placed",
                "currency": rng.choice(("USD", "USD", "EUR", "GBP")),
                "total": round(sum(i["quantity"] * i["unit_price"] for i in items), 2),
            }
            if rng.random() < 0.6:
                data["line_items"] = items
            if rng.random() < 0.3:
                data["ship_to"] = {"city": contact.city, "country": g.country[contact.city]}
            if rng.random() < 0.5:
                g.open_orders.append(data)
    else:
        if g.open_tickets and rng.random() < 0.35:
            data = dict(g.open_tickets.pop(rng.randrange(len(g.open_tickets))))
            data["status"] = rng.choice(("pending", "resolved", "closed"))
            data["updated_at"] = _ts(sec)
            if data["status"] != "pending":
                data["resolved_at"] = _ts(sec)
        else:
            prod = rng.choice(g.products)
            data = {
                "ticket_id": f"TCK-{g.next_id('ticket')[-6:]}",
                "customer_id": comp.customer_id,
                "company": comp.name,
                "contact_name": contact.name,
                "assignee": staff.name,
                "subject": rng.choice(
                    (
                        f"{prod} export fails",
                        f"Cannot log in to {prod}",
                        f"Invoice question for {comp.name}",
                        f"{prod} is slow since the last update",
                        f"Request to add users to {prod}",
                    )
                ),
                "product": prod,
                "priority": rng.choice(("low", "normal", "normal", "high", "urgent")),
                "status": "open",
                "opened_at": _ts(sec),
            }
            if rng.random() < 0.5:
                g.open_tickets.append(data)
    rec: dict[str, Any] = {
        "group_id": g.group_id,
        "id": g.next_id("rec"),
        "kind": "json",
        "timestamp": _ts(sec),
        "source": source,
        "data": data,
    }
    if rng.random() < 0.6:
        rec["source_description"] = JSON_SOURCE_DESCRIPTIONS[source]
    return rec


def _text_record(g: _Group, fl: _Filler, sec: int) -> dict[str, Any]:
    """One short note or memo of 2-5 sentences."""
    rng = fl.rng
    fl.speaker = None
    fl.when = EPOCH + timedelta(seconds=sec)
    ch: dict[str, Any] = {}
    title, ch = fl.fill(*rng.choice(_TITLES), ch)
    opener, ch = fl.fill(*rng.choice(_OPENERS), ch)
    sentences = [opener]
    for _ in range(rng.randint(1, 4)):
        fmt, fields, effect = rng.choice(_FACTS)
        # Keep the note about the same company/person as its title half of the time.
        keep = (
            {k: v for k, v in ch.items() if k in ("person", "company")}
            if rng.random() < 0.5
            else None
        )
        text, used = fl.fill(fmt, fields, keep)
        fl.apply(effect, used)
        sentences.append(text)
    rec: dict[str, Any] = {
        "group_id": g.group_id,
        "id": g.next_id("note"),
        "kind": "text",
        "timestamp": _ts(sec),
        "title": title,
        "content": " ".join(sentences),
    }
    if rng.random() < 0.5:
        rec["source_description"] = rng.choice(TEXT_SOURCES)
    return rec


def _daytime(rng: random.Random) -> int:
    """A random second of the timeline, during waking hours."""
    return rng.randrange(SPAN_DAYS) * 86400 + rng.randint(7 * 3600, 20 * 3600)


def _generate_group(
    gi: int, n: int, seed: int, records: list[tuple[int, int, int, dict[str, Any]]]
) -> None:
    """Append ``n`` records of group ``gi``, generated in timeline order."""
    g = _Group(gi, seed)
    rng = random.Random(f"tkg-synth:{seed}:{gi}:episodes")
    fl = _Filler(g, rng)
    n_msg = round(n * 0.7)
    n_json = min(n - n_msg, round(n * 0.2))
    n_text = n - n_msg - n_json
    events: list[tuple[int, int, int]] = []  # (second, kind 0/1/2, session length)
    left = n_msg
    while left > 0:
        length = min(left, rng.randint(5, 30))
        left -= length
        events.append((_daytime(rng), 0, length))
    events += [(rng.randrange(SPAN_DAYS * 86400), 1, 1) for _ in range(n_json)]
    events += [(_daytime(rng), 2, 1) for _ in range(n_text)]
    events.sort()
    handlers: dict[int, Callable[[_Group, _Filler, int], dict[str, Any]]] = {
        1: _json_record,
        2: _text_record,
    }
    for sec, kind, length in events:
        if kind == 0:
            _session(g, fl, sec, length, records, gi)
        else:
            records.append((sec, gi, len(records), handlers[kind](g, fl, sec)))


def generate_episodes(n: int, *, seed: int = 0, groups: int = 3) -> list[dict]:
    """n input records following the input contract, as dicts ready to be written as JSON Lines.

    Records of all groups are interleaved in timestamp order. About 70 % are ``message``,
    20 % ``json`` and 10 % ``text``; the same ``(n, seed, groups)`` always gives the same
    records.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if groups < 1:
        raise ValueError("groups must be >= 1")
    records: list[tuple[int, int, int, dict[str, Any]]] = []
    base, extra = divmod(n, groups)
    for gi in range(groups):
        size = base + (gi < extra)
        if size:
            _generate_group(gi, size, seed, records)
    records.sort(key=lambda r: r[:3])
    return [r[3] for r in records]


def write_jsonl(records: Iterable[dict], path: Path) -> Path:
    """Write ``records`` as JSON Lines (UTF-8) to ``path``; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(dumps(r) + "\n" for r in records)
    return path
