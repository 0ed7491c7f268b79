import json
import os

import pytest

from attnlab.utils.io import atomic_write_json, atomic_writer


def test_atomic_writer_leaves_the_old_file_and_nothing_else_on_error(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(target) as fh:
        fh.write(b"half")
        raise RuntimeError("killed")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_atomic_write_json_replaces_the_file(tmp_path):
    target = tmp_path / "sub" / "s.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2} and os.listdir(target.parent) == ["s.json"]
