"""API keys of `tkg serve`: each bound to the group ids it may read, stored hashed.

The keys file is JSON: `{"keys": [{"name": ..., "sha256": ..., "groups": [...]}]}`. Only
the SHA-256 of a key is kept (keys are 32 random bytes, so a fast hash is enough: there is
nothing to brute-force), and lookups compare digests in constant time. `tkg keys add`
creates a key, prints it once and stores its hash; `tkg keys list` shows names, ids (the
start of the hash) and groups; `tkg keys revoke` removes keys, and a running server
(`KeyFile`) refuses them from its next request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


class KeyFile:
    """A server's keys file, read again when it changes (one stat per request), so a key
    revoked with `tkg keys revoke` stops working without a restart. Iterating gives the
    keys (what `lookup` reads). A file that goes missing or turns malformed leaves no key
    valid: every request is refused until it is fixed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._keys = load(self.path)  # a bad file stops the server before it starts

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino

    def current(self) -> tuple[ApiKey, ...]:
        stamp = self._stat()
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._keys = load(self.path)
                except KeysError:
                    self._keys = ()
                self._stamp = stamp
            return self._keys

    def __iter__(self) -> Iterator[ApiKey]:
        return iter(self.current())


def lookup(keys: Iterable[ApiKey], presented: str | None) -> ApiKey | None:
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


def caller_groups(keys: Iterable[ApiKey], headers: Mapping[str, str]) -> frozenset[str]:
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
    _write(path, entries)
    return key


ID_CHARS = 12  # a key's id in `tkg keys list`: the start of its hash (not of the key)


def listed(path: str | Path) -> list[dict[str, object]]:
    """The keys of a keys file as `tkg keys list` shows them: name, id, groups."""
    return [{"name": k.name, "id": k.sha256[:ID_CHARS], "groups": sorted(k.groups)}
            for k in load(path)]


def revoke(path: str | Path, name: str | None = None, key_id: str | None = None) -> list[str]:
    """Remove the keys named `name`, or the one whose id (`tkg keys list`) is `key_id`;
    returns the ids removed. A server reading the file refuses them from its next request
    (`KeyFile`)."""
    if (name is None) == (key_id is None):
        raise KeysError("name the key to revoke: --name NAME or --id ID (`tkg keys list`)")
    load(path)  # a malformed file is reported, not rewritten
    entries = json.loads(Path(path).read_text())["keys"]
    gone = [e for e in entries if (e["name"] == name if name is not None
                                   else str(e["sha256"]).lower().startswith(key_id.lower()))]
    if not gone or (key_id is not None and len(gone) > 1):
        what = f"named {name!r}" if name is not None else f"with id {key_id!r}"
        many = " (more than one: give more of the id)" if gone else ""
        raise KeysError(f"no single key {what} in {path}{many}; `tkg keys list --keys {path}` "
                        "shows them")
    _write(Path(path), [e for e in entries if e not in gone])
    return [str(e["sha256"])[:ID_CHARS] for e in gone]


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    """Replace the keys file at once (0600): a server never reads half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"keys": entries}, handle, indent=2)
    os.replace(tmp, path)
