"""API keys of `tkg serve`: each bound to the group ids it may read, stored hashed.

The keys file is JSON: `{"keys": [{"name": ..., "sha256": ..., "groups": [...]}]}`. Only
the SHA-256 of a key is kept (keys are 32 random bytes, so a fast hash is enough: there is
nothing to brute-force), and lookups compare digests in constant time. `tkg keys add`
creates a key, prints it once and stores its hash.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tkg.pipeline.config import GROUP_ID_PATTERN

PREFIX = "tkg_"


class KeysError(ValueError):
    """The keys file is missing or malformed; the message says how to fix it."""


class Unauthorized(PermissionError):
    """A request without a known key where keys are required."""


class Forbidden(PermissionError):
    """A request for groups its caller may not read."""


class NoGroups(ValueError):
    """A request that names no groups where nothing says which to read."""


@dataclass(frozen=True)
class ApiKey:
    name: str
    sha256: str
    groups: frozenset[str]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def load(path: str | Path) -> tuple[ApiKey, ...]:
    """Read and validate a keys file (every group id must be a valid group id)."""
    path = Path(path)
    if not path.is_file():
        raise KeysError(f"keys file {path} not found; create one with "
                        f"`tkg keys add --keys {path} --name NAME --group G`")
    try:
        entries = json.loads(path.read_text())["keys"]
        keys = tuple(ApiKey(str(e["name"]), str(e["sha256"]).lower(), frozenset(e["groups"]))
                     for e in entries)
    except (ValueError, KeyError, TypeError) as exc:
        raise KeysError(f"{path} is not a keys file ({exc}); expected "
                        '{"keys": [{"name": ..., "sha256": ..., "groups": [...]}]}') from exc
    for key in keys:
        bad = [g for g in key.groups if not GROUP_ID_PATTERN.fullmatch(str(g))]
        if bad or not key.groups or len(key.sha256) != 64:
            raise KeysError(f"{path}: key {key.name!r} needs a sha256 hex digest and valid "
                            f"group ids (bad: {bad})")
    return keys


def lookup(keys: tuple[ApiKey, ...], presented: str | None) -> ApiKey | None:
    """The key whose hash matches `presented` (every entry is compared: constant time)."""
    if not presented:
        return None
    wanted = digest(presented)
    found = None
    for key in keys:
        if hmac.compare_digest(key.sha256, wanted):
            found = key
    return found


def presented(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY`, else `X-API-Key: KEY`."""
    header = headers.get("authorization") or ""
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return headers.get("x-api-key")


def caller_groups(keys: tuple[ApiKey, ...], headers: Mapping[str, str]) -> frozenset[str]:
    """The groups the key in `headers` may read (Unauthorized without a known key)."""
    key = lookup(keys, presented(headers))
    if key is None:
        raise Unauthorized("missing or unknown API key (Authorization: Bearer KEY)")
    return key.groups


def readable(asked: Sequence[str] | None, may_read: frozenset[str] | None) -> list[str]:
    """The groups a request reads: those it names, or every group it may read when it names
    none (`may_read` None: no restriction, so it must name them). Naming a group outside
    `may_read` is refused with the same words whether or not that group has data anywhere,
    so the refusal tells nothing about other tenants."""
    if not asked:
        if may_read is None:
            raise NoGroups("give the group ids to read (group_id=G)")
        return sorted(may_read)
    if may_read is not None and not set(asked) <= may_read:
        raise Forbidden(f"group(s) {sorted(set(asked) - may_read)} may not be read with this "
                        "key or server")
    return list(asked)


def add(path: str | Path, name: str, groups: list[str]) -> str:
    """Create a key for `groups`, store its hash in `path` (created 0600), return the key."""
    bad = [g for g in groups if not GROUP_ID_PATTERN.fullmatch(g)]
    if bad or not groups:
        raise KeysError(f"invalid group ids {bad}: group ids match [A-Za-z0-9_-]{{1,128}}")
    path = Path(path)
    entries = json.loads(path.read_text())["keys"] if path.is_file() else []
    key = PREFIX + secrets.token_urlsafe(32)
    entries.append({"name": name, "sha256": digest(key), "groups": sorted(set(groups))})
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"keys": entries}, handle, indent=2)
    os.replace(tmp, path)
    return key
