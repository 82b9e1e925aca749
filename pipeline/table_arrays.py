"""What a query process derives from a retrieval table when it opens a snapshot (the rows
without their vectors, unit vectors, BM25 postings), computed at publish and written beside
the table's LanceDB folder, so an open maps files instead of computing them.

At 100,000 facts one open cost 1.25 s (1.49 s of CPU; cProfile: postings 0.47 s, unit
vectors 0.38 s, the rows 0.11 s, of 1.25), twice per publish in a `tkg serve` of several
processes, while they answered. The files of table T lie in `LANCE/T.arrays/` of the
snapshot that wrote them (the manifest's `arrays`, `store.arrays_dirs`; beside LanceDB's
`LANCE/T.lance/` for snapshots published before it), so a table a later snapshot keeps
keeps them, and the store's clean-up keeps them with the folder. `arrays.json` is written last and
lists what was written; a table without it (published before these files existed) is
computed at open as before, with the same functions, so both give the same bits. Locally
the files are memory-mapped (the pages are shared by every process of a server); on an
object store they are read whole.
"""

from __future__ import annotations

import io
import itertools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tkg.pipeline import storage
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.postings import Postings
from tkg.pipeline.storage import Location

SUFFIX = ".arrays"  # LANCE/<table>.arrays/, beside LanceDB's LANCE/<table>.lance/
INDEX = "arrays.json"
HASH = "_hash"  # a retrieval table's row digest (`index.digests`), of no use to an open
META, VECTORS, TERMS = "meta.arrow", "vectors.npy", "terms.arrow"
POSTINGS = ("start", "rows", "counts", "lengths", "documents", "average_length", "gains")


def folder(lance_dir: Location, name: str) -> Location:
    return storage.join(lance_dir, name + SUFFIX)


def by_row(data: pa.Table) -> pa.Table:
    """`data` in `row` order: as a scan of the table gives it, and then without the sort
    (a copy of every column: a tenth of opening a snapshot)."""
    rows = data["row"].to_numpy()
    return data if bool(np.all(rows[1:] > rows[:-1])) else data.sort_by("row")


def read_meta(table: Any, rows: int) -> pa.Table:
    """A LanceDB table's rows without their vectors, in `row` order (ValueError where
    they are not rows 0 to `rows` - 1)."""
    names = [f.name for f in table.schema if f.name not in ("vector", HASH)]
    data = by_row(table.search().select(names).limit(rows).to_arrow()).combine_chunks()
    if data.num_rows != rows or not np.array_equal(data["row"].to_numpy(),
                                                   np.arange(rows, dtype=np.int64)):
        raise ValueError("retrieval table rows are not contiguous; rebuild the snapshot")
    return data


def unit_vectors(table: Any, rows: int, keys: np.ndarray | None = None,
                 block: int = 8_192) -> np.ndarray:
    """Every row's vector over its norm (a zero vector stays zero), float32, in row order,
    or in the order of `keys` (the `row` values of the rows, as `sorted_meta` gives them).
    Read by blocks of rows straight into their places: the table's vectors read whole, put
    in order and divided were three copies of them in the driver (735 MB for 160,000
    episodes), the peak of a night's publish."""
    place = None if keys is None else rows_of_keys(keys)
    unit = np.empty((rows, 0), dtype=np.float32)
    scan = table.search().select(["row", "vector"]).limit(max(rows, 1))
    for batch in scan.to_batches(block):
        at, vectors = _unit_batch(batch)
        if unit.shape[1] != vectors.shape[1]:
            unit = np.empty((rows, vectors.shape[1]), dtype=np.float32)
        unit[at if place is None else place[at]] = vectors
    return unit


def _unit_batch(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """The `row` keys of a batch and its vectors over their norms (the same arithmetic row
    by row, whatever the blocks)."""
    vectors = batch.column("vector").flatten().to_numpy().reshape(batch.num_rows, -1)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return batch.column("row").to_numpy(), vectors / np.where(norms > 0, norms, 1)


def _write_vectors(location: Location, table: Any, keys: np.ndarray,
                   earlier: Earlier | None) -> None:
    """`unit_vectors` in the order of `keys`, written as a `.npy` file: with the `earlier`
    arrays of the version an extension started from, spliced (`_extended_vectors`)."""
    extended = None if earlier is None else _extended_vectors(table, keys, earlier)
    if extended is None:
        vectors = unit_vectors(table, len(keys), keys)
        _write_file(location, lambda out: np.save(out, vectors))
    else:
        storage.write_spliced(location, *extended)


def _extended_vectors(table: Any, keys: np.ndarray, earlier: Earlier
                      ) -> tuple[Location, Iterator[storage.Piece]] | None:
    """The unit vectors of rows `keys` as the earlier vectors file and the pieces of the new
    one (`storage.write_spliced`): its header, each run of rows the `earlier` arrays hold
    in the same order (a range of their file), and each run of the others (the keys an
    extension added, above every kept one) read from LanceDB. None where the earlier arrays
    kept no vectors, hold none of the rows, lack a key below one they hold, or differ in
    width. Loading the earlier vectors and taking them into a new array were 1.3 s and 480
    MB of the driver (two tables of 240 MB) in the 160,000-episode night's publish;
    reading, taking and writing them a chunk of rows at a time, 1.36 s (py-spy)."""
    name = earlier.saved.listed.get("vectors")
    found, have = earlier.found, earlier.found >= 0
    first_new = int(keys[~have].min()) if not have.all() else int(keys.max(initial=-1)) + 1
    if name is None or not have.any() or int(keys[have].max()) >= first_new:
        return None
    source = storage.join(earlier.saved.where, name)
    with storage.input_file(source) as handle:
        shape, offset = _npy_layout(handle)
    added_at, added = _added_vectors(table, keys, first_new, shape[1])
    if added is None:
        return None
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
        "shape": (len(keys), shape[1])})
    width = shape[1] * 4

    def pieces() -> Iterator[storage.Piece]:
        yield header.getvalue()
        for start, end in _runs(found):
            if found[start] >= 0:
                yield offset + int(found[start]) * width, (end - start) * width
            else:
                yield memoryview(added[added_at[start:end]]).cast("B")

    return source, pieces()


def _runs(found: np.ndarray) -> Iterator[tuple[int, int]]:
    """[start, end) of each run of rows that are consecutive rows of the earlier file, or
    that it lacks (`found` -1)."""
    kept = found >= 0
    cuts = np.flatnonzero((kept[1:] != kept[:-1]) | (kept[1:] & (np.diff(found) != 1))) + 1
    return itertools.pairwise(np.r_[0, cuts, len(found)].tolist())


def _added_vectors(table: Any, keys: np.ndarray, first_new: int, width: int
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """The unit vectors of the rows under keys from `first_new` up (an extension's), read
    from LanceDB, and for each row now its place among them; None where their width is
    not `width`."""
    lacking = keys >= first_new
    at = np.full(len(keys), -1, dtype=np.int64)
    at[lacking] = np.arange(int(lacking.sum()), dtype=np.int64)
    place = rows_of_keys(keys[lacking] - first_new)
    added = np.empty((int(lacking.sum()), width), dtype=np.float32)
    scan = table.search().where(f"row >= {first_new}", prefilter=True).select(
        ["row", "vector"]).limit(max(len(keys), 1))  # (an int of ours)
    for batch in scan.to_batches(8_192):
        row, vectors = _unit_batch(batch)
        if vectors.shape[1] != width:
            return at, None
        added[place[row - first_new]] = vectors
    return at, added


def _npy_layout(handle: Any) -> tuple[tuple[int, ...], int]:
    """The shape of a float32 `.npy` file's C-ordered array and where its data begins."""
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}[np.lib.format.read_magic(handle)]
    shape, fortran, dtype = read_header(handle)
    if fortran or dtype != np.dtype(np.float32) or len(shape) != 2:
        raise ValueError(f"not the unit vectors publish writes: {shape} {dtype}")
    return shape, handle.tell()


def _earlier_rows(known: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of tables whose rows have the keys `known` (earlier) and `keys` (now): the row now of
    each earlier row and the earlier row of each row now, -1 where it has none."""
    size = int(max(keys.max(initial=-1), known.max(initial=-1))) + 1
    return rows_of_keys(keys, size)[known], rows_of_keys(known, size)[keys]


def _postings(meta: pa.Table, codes: np.ndarray, earlier: Earlier | None) -> Postings:
    """The postings of the rows' texts: extended from the `earlier` ones where there are
    (`Postings.extended`: only the rows they lack are tokenized), else built."""
    saved = None if earlier is None else earlier.saved.postings()
    if earlier is None or saved is None:
        return Postings.build(meta["text"], codes)
    return Postings.extended(saved, earlier.moved, meta["text"],
                             np.flatnonzero(earlier.found < 0), codes)


@dataclass
class Earlier:
    """The arrays of the version an extension started from (`saved`), matched once with
    the rows now: the row now of each earlier row (`moved`) and the earlier row of each row
    now (`found`), -1 where it has none."""

    saved: Saved
    moved: np.ndarray
    found: np.ndarray


def rows_of_keys(keys: np.ndarray, size: int | None = None) -> np.ndarray:
    """The row of each LanceDB `row` key (-1 where none), indexed by key up to `size` (by
    default the largest key): `keys` are the keys of the rows in order (an extended
    table's are not its positions)."""
    size = int(keys.max(initial=-1)) + 1 if size is None else size
    found = np.full(size, -1, dtype=np.int64)
    found[keys] = np.arange(len(keys), dtype=np.int64)
    return found


def keeps_vectors(rows: int, smallest_group: int, config: QueryConfig) -> bool:
    """Whether a table keeps its unit vectors in memory: small enough, and some group of
    it small enough to scan exactly (`query.memory_vector_rows`, `query.exact_scan_rows`)."""
    return rows <= config.memory_vector_rows and smallest_group <= config.exact_scan_rows


def keeps_postings(rows: int, config: QueryConfig) -> bool:
    return rows <= config.memory_text_rows


def positions(values: pa.ChunkedArray | pa.Array, keys: pa.Array) -> np.ndarray:
    """Position of each value in `keys`, -1 where absent (vectorised, no Python loop)."""
    index = pc.index_in(values, value_set=keys)
    return pc.fill_null(index, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def write(lance_dir: Location, table: Any, name: str, config: QueryConfig,
          order: Sequence[str], earlier: Saved | None = None) -> float:
    """Write what an open derives from LanceDB table `name`, into `lance_dir`, as the
    snapshot's query `config` asks; returns the seconds spent. It reads the table back
    (as checked out), so it is what an open would read; the rows go in `order` (the
    table's sort keys), whatever order an extended table holds them in. `earlier`: the
    arrays of the version an extended table started from (`unit_vectors`, `_postings`)."""
    started = time.perf_counter()
    rows = table.count_rows()
    if not rows:
        return 0.0  # (an open keeps nothing of an empty table)
    target = folder(lance_dir, name)
    known = None if earlier is None else earlier.meta()  # (read once: on S3 a GET)
    meta = sorted_meta(table, rows, order, known)
    matched = None if earlier is None else Earlier(
        earlier, *_earlier_rows(known["row"].to_numpy(), meta["row"].to_numpy()))
    _write_file(storage.join(target, META), lambda out: _write_ipc(out, meta))
    listed: dict[str, Any] = {"rows": rows, "meta": META}
    # codes of this table's own groups: their runs are those of the snapshot-wide codes an
    # open gives (both number sorted group ids; "" and null are -1 in both)
    unique = pc.unique(meta["group_id"]).drop_null()
    groups = unique.filter(pc.not_equal(unique, "")).sort()
    codes = positions(meta["group_id"], groups)
    if not np.any(np.diff(codes) < 0):  # (else an open keeps neither: rows not by group)
        sizes = np.bincount(codes[codes >= 0], minlength=len(groups))
        if keeps_vectors(rows, int(sizes.min()) if len(sizes) else 0, config):
            _write_vectors(storage.join(target, VECTORS), table, meta["row"].to_numpy(),
                           matched)
            listed["vectors"] = VECTORS
        if keeps_postings(rows, config):
            listed["postings"] = _write_postings(target, _postings(meta, codes, matched))
    storage.write_text(storage.join(target, INDEX), json.dumps(listed, sort_keys=True))
    return time.perf_counter() - started


def sorted_meta(table: Any, rows: int, order: Sequence[str], earlier: pa.Table | None = None
                ) -> pa.Table:
    """A LanceDB table's rows without their vectors and digests, in `order`; `row` holds
    each row's key in the table (its position too, in a table built whole). With the
    `earlier` meta of the version an extension started from, the rows it kept come from
    there (`_kept_meta`)."""
    names = [f.name for f in table.schema if f.name not in ("vector", HASH)]
    data = _kept_meta(table, rows, names, earlier) if earlier is not None else None
    if data is None:
        data = table.search().select(names).limit(rows).to_arrow()
    ranked = pc.sort_indices(data, sort_keys=[(c, "ascending") for c in order])
    keys = data["row"].to_numpy()
    if not np.array_equal(keys[ranked.to_numpy()], np.arange(rows, dtype=np.int64)):
        data = data.take(ranked)  # (a table built whole is scanned in order already)
    return data.combine_chunks()


def _kept_meta(table: Any, rows: int, names: list[str], meta: pa.Table) -> pa.Table | None:
    """The rows of the earlier `meta` whose keys the table still holds and the table's rows
    under the keys above them (those an extension added), read alone: the meta of the
    160,000-episode store's tables read whole took 1.2 s of a night's publish. None where
    the earlier meta has other columns, or the table holds a key below the highest kept
    one that the meta lacks."""
    if meta.column_names != names:
        return None
    keys = table.search().select(["row"]).limit(max(rows, 1)).to_arrow()["row"].to_numpy()
    now, before = _earlier_rows(meta["row"].to_numpy(), keys)
    kept = meta.take(pa.array(np.flatnonzero(now >= 0)))
    lacking = keys[before < 0]
    top = int(kept["row"].to_numpy().max(initial=-1))
    if len(lacking) and int(lacking.min()) <= top:
        return None
    added = table.search().where(f"row > {top}", prefilter=True).select(names).limit(
        max(rows, 1)).to_arrow()  # (an int of ours)
    if kept.num_rows + added.num_rows != rows or added.schema != kept.schema:
        return None
    return pa.concat_tables([kept, added])


def _write_postings(target: Location, postings: Postings) -> dict[str, str]:
    files = {}
    for field in POSTINGS:
        array = getattr(postings, field)
        files[field] = f"postings_{field}.npy"
        _write_file(storage.join(target, files[field]),
                    lambda out, array=array: np.save(out, array))
    terms = pa.table({"term": pa.array(list(postings.terms), pa.string())})
    _write_file(storage.join(target, TERMS), lambda out: _write_ipc(out, terms))
    files["terms"] = TERMS
    return files


def _write_file(location: Location, write_to: Callable[[Any], None]) -> None:
    """One file written by `write_to(stream)`, locally or to an object store."""
    with storage.output_stream(location) as handle:
        write_to(handle)


def _write_ipc(out: Any, data: pa.Table) -> None:
    with pa.ipc.new_file(out, data.schema) as writer:
        writer.write_table(data)


@dataclass
class Saved:
    """The files publish wrote for one table (`load`); each read when first asked for."""

    where: Location
    listed: dict[str, Any]

    def meta(self) -> pa.Table:
        return _read_ipc(storage.join(self.where, self.listed["meta"]))

    def vectors(self) -> np.ndarray | None:
        """The unit vectors, memory-mapped where local (a query process)."""
        name = self.listed.get("vectors")
        return _read_npy(storage.join(self.where, name)) if name else None

    def postings(self) -> dict[str, Any] | None:
        """`Postings`' fields, or None where publish did not build them."""
        files = self.listed.get("postings")
        if not files:
            return None
        terms = _read_ipc(storage.join(self.where, files["terms"]))["term"].to_pylist()
        return {"terms": dict(zip(terms, range(len(terms)), strict=True)),
                **{f: _read_npy(storage.join(self.where, files[f])) for f in POSTINGS}}


def load(lance_dir: Location, name: str, rows: int | None = None) -> Saved | None:
    """What publish wrote for table `name` of `lance_dir`, None where it wrote nothing
    (a snapshot published before these files, or files of another table's size than
    `rows`, where given)."""
    where = folder(lance_dir, name)
    try:
        listed = json.loads(storage.read_text(storage.join(where, INDEX)))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Saved(where, listed) if rows is None or listed.get("rows") == rows else None


def _read_npy(location: Location) -> np.ndarray:
    if storage.is_url(location):
        return np.load(io.BytesIO(storage.read_bytes(location)))
    # (a read-only view of the page cache, shared by every process that maps the file)
    return np.asarray(np.load(location, mmap_mode="r"))


def _read_ipc(location: Location) -> pa.Table:
    source = (pa.BufferReader(storage.read_bytes(location)) if storage.is_url(location)
              else pa.memory_map(str(location)))
    return pa.ipc.open_file(source).read_all()
