"""How a run's records are recognised and written: positions matched in input order, one
per position, and file names that are not UTF-8 kept byte for byte."""

from __future__ import annotations

import json
import os

from inferchain.resume import json_line, match_positions, parse_line


def test_records_are_matched_to_positions_in_input_order_one_each() -> None:
    inputs = ["a", "b", "a", "c", "a"]
    assert match_positions(["a", "b", "a", "c", "a"], inputs) == [0, 1, 2, 3, 4]
    # position 2 (an "a") failed and was dropped: the "a" after "c" is position 4's
    assert match_positions(["a", "b", "c", "a"], inputs) == [0, 1, 3, 4]
    # written out of order (an older run appended a retried one): still one each
    assert match_positions(["b", "c", "a", "a"], inputs) == [1, 3, 4, 0]
    assert match_positions(["a", "a", "a", "a", "z"], inputs) == [0, 2, 4, None, None]


def test_a_name_that_is_not_utf8_round_trips_through_a_utf8_line() -> None:
    raw = b"/data/\xff\xfe caf\xc3\xa9.png"
    name = os.fsdecode(raw)
    line = json_line({"file": name, "text": "\u00e9\u4e2d"})
    encoded = line.encode("utf-8")  # strict: the line is UTF-8
    assert "\u4e2d".encode() in encoded and b"\\udcff" in encoded
    record = parse_line(encoded)
    assert record is not None and os.fsencode(record["file"]) == raw
    assert json.loads(line)["text"] == "\u00e9\u4e2d"


def test_only_whole_lines_are_records() -> None:
    assert parse_line(b'{"file": "a"}\n') == {"file": "a"}
    assert parse_line(b'{"file": "a"}') is None  # lost its newline
    assert parse_line(b'{"file": "a\n') is None  # torn
    assert parse_line(b"[1, 2]\n") is None
    assert parse_line(b'{"file": "\xff"}\n') is None  # not UTF-8
