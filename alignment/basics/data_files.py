"""Dataset files as rows: each format a user brings, read by a well-kept library, as (row number, dict) pairs.

- .jsonl (and any other name): one JSON object per line, read line by line; the number is the line's.
- .json: a JSON array of objects, or JSON lines (the two layouts `datasets`' json loader reads).
- .parquet: pyarrow, a batch of rows at a time (verl's recipes write these).
- .csv: the csv module; every value is text, as written; the number is the line the row starts on.
- a folder: `datasets.load_from_disk`, as `Dataset.save_to_disk` wrote it (TRL users' datasets); a DatasetDict's folder
  is refused naming its splits, each of which is a folder to give.
Rows of a parquet file, a json array or a folder are numbered from 1. A file that cannot be read as its name says raises
DataError naming it; a row that is not an object raises DataError "file:number: what", or is passed to on_error.
"""

import codecs
import csv
import json
from pathlib import Path
from typing import Callable, Iterator, Optional

from alignment.basics.errors import DataError
from alignment.basics.json_depth import MAX_JSON_DEPTH, json_too_deep

# A longer line is a bad row, read past in 1 MiB pieces, never held whole: a file that is not jsonl (no newlines)
# must not be read into memory as one line. Rows with long reference solutions or test cases fit well within it.
MAX_LINE_BYTES = 64 * 2**20
PARQUET_BATCH_ROWS = 1024
FORMATS = ".jsonl, .json, .parquet, .csv or a folder written by datasets' save_to_disk"

Rows = Iterator[tuple[int, dict]]


def read_rows(path: str, on_error: Optional[Callable[[DataError], None]] = None) -> Rows:
    """Yields (row number, row) for each row of the dataset at path, by its format (above)."""
    if Path(path).is_dir():
        return _saved_dataset(path)
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return _parquet(path)
    if suffix == ".csv":
        return _csv(path, on_error)
    if suffix == ".json" and _starts_with_array(path):
        return _json_array(path, on_error)
    return read_jsonl(path, on_error)


def _saved_dataset(path: str) -> Rows:
    import datasets  # imported only for a folder: it takes seconds

    if (Path(path) / "dataset_dict.json").is_file():
        splits = json.loads((Path(path) / "dataset_dict.json").read_text()).get("splits", [])
        raise DataError(f"{path}: a DatasetDict with splits {', '.join(splits)}: give one split's folder, e.g. {Path(path) / splits[0]}"
                        if splits else f"{path}: a DatasetDict with no splits")
    if not (Path(path) / "state.json").is_file():
        raise DataError(f"{path}: a folder, but not one written by datasets' save_to_disk (no state.json); datasets are {FORMATS}")
    try:
        dataset = datasets.load_from_disk(path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot be read by datasets.load_from_disk: {e}") from None
    yield from enumerate(dataset, start=1)


def _parquet(path: str) -> Rows:
    import pyarrow
    import pyarrow.parquet

    try:
        batches = pyarrow.parquet.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (OSError, pyarrow.ArrowException) as e:
        raise DataError(f"{path}: not a readable parquet file: {e}") from None


def _csv(path: str, on_error: Optional[Callable[[DataError], None]]) -> Rows:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, strict=True)
            if not reader.fieldnames:
                return
            line = reader.line_num + 1  # the header read: the first row starts on the next line
            for row in reader:
                if None in row or None in row.values():
                    error = DataError(f"{path}:{line}: {len(reader.fieldnames)} columns in the header, another number here")
                    if on_error is None:
                        raise error
                    on_error(error)
                else:
                    yield line, row
                line = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: not valid csv: {e}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror}") from None


def _starts_with_array(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4096).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"[")
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror}") from None


def _json_array(path: str, on_error: Optional[Callable[[DataError], None]]) -> Rows:
    try:
        text = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if (depth := json_too_deep(text)) and depth > MAX_JSON_DEPTH + 1:  # the array itself is one level
        raise DataError(f"{path}: arrays or objects nested {depth} deep; a row may nest at most {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    for number, row in enumerate(rows, start=1):
        if isinstance(row, dict):
            yield number, row
            continue
        error = DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        if on_error is None:
            raise error
        on_error(error)


def read_jsonl(path: str, on_error: Optional[Callable[[DataError], None]] = None):
    """Yields (line_number, row) for each non-blank line. A line that is not one JSON object (not UTF-8, not JSON,
    another JSON value, over MAX_LINE_BYTES) raises DataError "file:line: what", or, given on_error, is passed to
    it and left out."""
    try:
        handle = open(path, "rb")  # decoded line by line, so a bad byte is reported on its own line
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror}") from None
    with handle:
        line_number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            line_number += 1
            try:
                row = _json_object(raw, handle, first=line_number == 1)
            except ValueError as e:
                if on_error is None:
                    raise DataError(f"{path}:{line_number}: {e}") from None
                on_error(DataError(f"{path}:{line_number}: {e}"))
                continue
            if row is not None:
                yield line_number, row


def _json_object(raw: bytes, handle, first: bool) -> Optional[dict]:
    """One line's bytes -> its JSON object, None for a blank line; ValueError saying what is wrong."""
    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
        while (rest := handle.readline(2**20)) and not rest.endswith(b"\n"):
            pass
        raise ValueError(f"longer than {MAX_LINE_BYTES // 2**20} MiB (MAX_LINE_BYTES)")
    if first:
        raw = raw.removeprefix(codecs.BOM_UTF8)  # some Windows tools start UTF-8 files with one
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not line.strip():
        return None
    if depth := json_too_deep(line):
        raise ValueError(f"arrays or objects nested {depth} deep; a row may nest at most {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} (column {e.colno})") from None
    except ValueError as e:  # an integer longer than int() converts (sys.get_int_max_str_digits())
        raise ValueError(f"not valid JSON: {str(e).split(';')[0]}") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    return row
