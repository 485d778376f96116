"""C2SP ``tlog-tiles``: tile coordinates and paths, tile bytes, entry bundles, a hash reader over tiles.

Tile height is 8 (the spec's): a full tile holds 256 hashes. The tile at level ``L``, index ``N``
holds the hashes of the tree nodes at height ``8 * L``, indices ``256 * N`` to ``256 * N + W - 1``
(each such node covers ``256**L`` leaves); a partial tile (``W`` < 256) is served at
``tile/<L>/<N>.p/<W>`` until the full one exists. ``N`` is written in groups of three digits, every
group but the last prefixed with ``x`` (``1234067`` is ``x001/x234/067``). Entry bundles
(``tile/entries/<N>``) hold the leaves themselves, each a big-endian uint16 length then the bytes.
Every path names immutable content: a full tile never changes, a partial one is replaced by a wider
path, never rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from tollgate_client.tlog.merkle import HASH_SIZE, HashReader, node_hash

__all__ = [
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "entry_bundle",
    "hash_reader_from_tiles",
    "parse_entry_bundle",
    "parse_tile_path",
    "tile_bytes",
    "tile_path",
    "tiles_for_size",
]

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
_PATH = re.compile(r"^tile/(entries|[0-9]+)/((?:x[0-9]{3}/)*[0-9]{3})(?:\.p/([0-9]+))?$")

TileFetcher = Callable[[int, int, int], bytes]


def _encode_index(index: int) -> str:
    if index < 0:
        raise ValueError("a tile index is not negative")
    digits = str(index)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
    return "/".join([*("x" + g for g in groups[:-1]), groups[-1]])


def tile_path(level: int | str, index: int, width: int = TILE_WIDTH) -> str:
    """``tile/<level>/<index>[.p/<width>]``; ``level`` ``"entries"`` names an entry bundle."""
    if not 1 <= width <= TILE_WIDTH:
        raise ValueError("a tile is 1 to 256 wide")
    if level != "entries" and (not isinstance(level, int) or not 0 <= level <= 63):
        raise ValueError("a tile level is 0 to 63")
    suffix = "" if width == TILE_WIDTH else f".p/{width}"
    return f"tile/{level}/{_encode_index(index)}{suffix}"


def parse_tile_path(path: str) -> tuple[int | str, int, int]:
    """``(level or "entries", index, width)`` of a tile path; ``ValueError`` for any other spelling."""
    match = _PATH.match(path)
    if not match:
        raise ValueError(f"not a tile path: {path!r}")
    level_text, index_text, width_text = match.groups()
    level: int | str = "entries" if level_text == "entries" else int(level_text)
    if level_text not in ("entries", str(level)):
        raise ValueError("a tile level has no leading zeroes")
    index = int(index_text.replace("x", "").replace("/", ""))
    width = TILE_WIDTH if width_text is None else int(width_text)
    if width_text is not None and (width_text != str(width) or not 1 <= width < TILE_WIDTH):
        raise ValueError("a partial tile is 1 to 255 wide")
    if tile_path(level, index, width) != path:
        raise ValueError("non-canonical tile path")
    return level, index, width


def tiles_for_size(size: int) -> list[tuple[int, int, int]]:
    """Every ``(level, index, width)`` hash tile of the tree of ``size`` leaves."""
    tiles: list[tuple[int, int, int]] = []
    level = 0
    nodes = size
    while nodes > 0:
        full, partial = divmod(nodes, TILE_WIDTH)
        tiles += [(level, index, TILE_WIDTH) for index in range(full)]
        if partial:
            tiles.append((level, full, partial))
        level += 1
        nodes >>= TILE_HEIGHT
    return tiles


def tile_bytes(level: int, index: int, width: int, read: HashReader) -> bytes:
    """The content of a hash tile: its ``width`` node hashes, concatenated."""
    height = level * TILE_HEIGHT
    first = index * TILE_WIDTH
    return b"".join(read(height, first + i) for i in range(width))


def hash_reader_from_tiles(size: int, fetch: TileFetcher) -> HashReader:
    """A :data:`HashReader` over the tiles of a tree of ``size`` leaves, fetched with ``fetch(level, index, width)``.

    Any complete subtree's hash is rebuilt from the tile of the level just below it (up to 7 levels of
    hashing). A tile of the wrong length raises ``ValueError``.
    """
    cache: dict[tuple[int, int], bytes] = {}

    def tile(level: int, index: int) -> bytes:
        nodes = size >> (level * TILE_HEIGHT)
        width = min(TILE_WIDTH, nodes - index * TILE_WIDTH)
        if width <= 0:
            raise ValueError("no such tile in this tree")
        key = (level, index)
        if key not in cache:
            data = fetch(level, index, width)
            if len(data) != width * HASH_SIZE:
                raise ValueError(f"tile {tile_path(level, index, width)} is {len(data)} bytes")
            cache[key] = data
        return cache[key]

    def read(height: int, index: int) -> bytes:
        tile_level, rest = divmod(height, TILE_HEIGHT)
        first = index << rest  # the first node of the tile level below this node
        count = 1 << rest
        hashes: list[bytes] = []
        for position in range(first, first + count):
            data = tile(tile_level, position // TILE_WIDTH)
            offset = (position % TILE_WIDTH) * HASH_SIZE
            hashes.append(data[offset : offset + HASH_SIZE])
        while len(hashes) > 1:
            hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
        return hashes[0]

    return read


def entry_bundle(entries: Iterable[bytes]) -> bytes:
    """An entry bundle: each entry as a big-endian uint16 length and its bytes."""
    out = bytearray()
    for entry in entries:
        if len(entry) > 0xFFFF:
            raise ValueError("an entry is at most 65,535 bytes")
        out += len(entry).to_bytes(2, "big") + entry
    return bytes(out)


def parse_entry_bundle(data: bytes) -> list[bytes]:
    """The entries of an entry bundle; ``ValueError`` when it is truncated."""
    entries: list[bytes] = []
    position = 0
    while position < len(data):
        if position + 2 > len(data):
            raise ValueError("truncated entry bundle")
        length = int.from_bytes(data[position : position + 2], "big")
        position += 2
        if position + length > len(data):
            raise ValueError("truncated entry bundle")
        entries.append(data[position : position + length])
        position += length
    return entries
