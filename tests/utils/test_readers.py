"""The readers of users' small files: every failure names the file (and line or byte) and
what was expected."""

from __future__ import annotations

import pytest

from attnlab.utils.readers import parse_json, read_json, read_jsonl, read_text


def test_text_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("héllo\n".encode() + b"\x80 rest")
    with pytest.raises(ValueError, match=rf"{path}: not UTF-8 text \(invalid byte at offset 7\); "
                                         "expected a note"):
        read_text(path, "a note")
    path.write_text("héllo\n")
    assert read_text(path, "a note") == "héllo\n"


@pytest.mark.parametrize("content, words", [
    ("{\n  \"a\": 1,\n}", r"not valid JSON \(.* at line 3, column 1\); expected a thing; fix it"),
    ("[1]", "an array, not a JSON object; expected a thing; fix it"),
    ("null", "null, not a JSON object"),
])
def test_json_names_the_file_the_place_and_what_was_expected(content, words, tmp_path):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"{path}: {words}"):
        read_json(path, "a thing", "; fix it")
    if content == "[1]":
        assert parse_json(path, "a thing") == [1]


def test_json_lines_name_the_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n')
    assert read_jsonl(path, "records", keys=("step",)) == [{"step": 1}, {"step": 2}]
    for bad, words in (('{"step": 3\n', r":4: not valid JSON \(.*column 11\)"),
                       ('"x"\n', ":4: a string, not a JSON object"),
                       ('{"loss": 1}\n', ":4: a record without 'step'; expected records")):
        path.write_text('{"step": 1}\n\n{"step": 2}\n' + bad)
        with pytest.raises(ValueError, match=f"{path}{words}"):
            read_jsonl(path, "records", keys=("step",))


def test_a_last_line_cut_off_is_left_out(tmp_path):
    """A record being written (or cut off by a crash) has no line break yet."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    assert read_jsonl(path, "records") == [{"step": 1}]
    path.write_text('{"step": 1}\n{"step": 2, "lo\n')  # complete, and damaged
    with pytest.raises(ValueError, match=":2: not valid JSON"):
        read_jsonl(path, "records")
