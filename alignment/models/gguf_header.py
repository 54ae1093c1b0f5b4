"""A GGUF file's header walked for its counts and lengths before the gguf package reads it (alignment/models/gguf_import.py's
import): the package keeps numpy views for each metadata value, each item of an array included (measured: 45-70 us and
0.7-1.3 KB an item), so 2 million short strings in a 29 MB file took 36 s and 2.7 GB before anything could refuse them."""

import mmap
import struct
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

from alignment.basics.errors import GGUFImportError

MAX_METADATA_ITEMS = 1_000_000  # in all metadata arrays: Llama 3's vocabulary is 536k (128k tokens, their types, 280k merges)
MAX_KEYS = 4096  # metadata keys; llama.cpp's converter writes 30-60
MAX_TENSORS = 8192  # the importer's architectures hold at most 14 tensors a layer, and 3 more
MAX_KEY_BYTES = 65_535  # a key's length, as the GGUF specification bounds it
MAX_NAME_BYTES, MAX_DIMS = 64, 4  # a tensor's name and dimensions, as ggml bounds them (GGML_MAX_NAME, GGML_MAX_DIMS)


class _HeaderWalk:
    """A GGUF header read from a memory map for its counts and lengths only, each checked against the bytes left."""

    def __init__(self, source: Path, view):
        self.source, self.view, self.at = source, view, 4  # after the magic bytes
        self.order = ">" if view[4:6] == b"\0\0" else "<"  # the version's low bytes zero: big-endian, as GGUFReader tells

    def refuse(self, what: str):
        raise GGUFImportError(f"{self.source}: {what}")

    def need(self, size: int, what: str) -> None:
        if size > len(self.view) - self.at:
            self.refuse(f"{what} needs {size:,} bytes at byte {self.at:,}, past the end of the file ({len(self.view):,} bytes)")

    def skip(self, size: int, what: str) -> None:
        self.need(size, what)
        self.at += size

    def number(self, form: str, what: str) -> int:
        size = struct.calcsize(form)
        self.need(size, what)
        self.at += size
        return struct.unpack_from(self.order + form, self.view, self.at - size)[0]

    def string(self, what: str, most: int | None = None) -> str:
        """Skips a string (uint64 length, then its bytes) -> its text when `most` bounds it (a key, a name), else ""."""
        length = self.number("Q", what)
        if most is not None and length > most:
            self.refuse(f"{what} is {length:,} bytes long; at most {most:,} are read")
        self.skip(length, what)
        return "" if most is None else bytes(self.view[self.at - length : self.at]).decode("utf-8", "replace")

    def value(self, key: str, kind: int, items_left: int) -> int:
        """Skips metadata `key`'s value of type `kind` -> the items of its array (0 for a single value)."""
        if kind != GGUFValueType.ARRAY:
            self.single(key, kind)
            return 0
        kind, count = self.number("I", key), self.number("Q", key)
        if kind == GGUFValueType.ARRAY:
            self.refuse(f"metadata {key} is an array of arrays; GGUF readers (llama.cpp's) take arrays of single values only")
        if count > items_left:
            self.refuse(f"metadata {key} holds {count:,} items, more than the {MAX_METADATA_ITEMS:,} all arrays together may hold "
                        "(MAX_METADATA_ITEMS)")
        if kind != GGUFValueType.STRING:
            self.skip(count * self.size(key, kind), key)
            return count
        self.need(count * 8, key)  # each string's length at least, before they are walked
        for _ in range(count):
            self.string(key)
        return count

    def single(self, key: str, kind: int) -> None:
        if kind == GGUFValueType.STRING:
            self.string(key)
        else:
            self.skip(self.size(key, kind), key)

    def size(self, key: str, kind: int) -> int:
        if kind not in GGUFReader.gguf_scalar_to_np:
            self.refuse(f"metadata {key} has value type {kind}, which GGUF does not define")
        return np.dtype(GGUFReader.gguf_scalar_to_np[GGUFValueType(kind)]).itemsize


def check_header(source: Path) -> None:
    """Refuses a GGUF whose header would take the gguf package long or much memory to read, from its counts and lengths
    alone (nothing is kept): more than MAX_METADATA_ITEMS items in arrays, MAX_KEYS keys or MAX_TENSORS tensors, an array
    of arrays, a key, name or number of dimensions past its bound, a count or length that reaches past the file's end."""
    with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        walk = _HeaderWalk(source, view)
        version = walk.number("I", "the version")
        if version not in READER_SUPPORTED_VERSIONS:
            walk.refuse(f"GGUF version {version}; the importer reads versions {', '.join(map(str, READER_SUPPORTED_VERSIONS))}")
        tensors, keys = walk.number("Q", "the tensor count"), walk.number("Q", "the key count")
        for count, most, what in ((keys, MAX_KEYS, "metadata keys"), (tensors, MAX_TENSORS, "tensors")):
            if count > most:
                walk.refuse(f"the header counts {count:,} {what}; at most {most:,} are read")
        items = 0
        for index in range(keys):
            key = walk.string(f"metadata key {index}", MAX_KEY_BYTES)
            items += walk.value(key, walk.number("I", key), MAX_METADATA_ITEMS - items)
        for index in range(tensors):
            name = walk.string(f"tensor {index}'s name", MAX_NAME_BYTES)
            dims = walk.number("I", f"tensor {name}")
            if dims > MAX_DIMS:
                walk.refuse(f"tensor {name} has {dims:,} dimensions; ggml's tensors have at most {MAX_DIMS}")
            walk.skip(8 * dims + 4 + 8, f"tensor {name}")  # its dimensions, type and offset
