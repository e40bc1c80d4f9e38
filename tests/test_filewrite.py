"""engine._filewrite: a batch of files written by compiled code, one errno (as text) per file."""

from __future__ import annotations

import os
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from engine._filewrite import write_files


def test_a_batch_is_written_byte_for_byte_from_any_buffer(tmp_path: Path) -> None:
    segment = shared_memory.SharedMemory(create=True, size=300_000)
    try:
        segment.buf[:300_000] = os.urandom(300_000)
        slot = segment.buf[1000:201_000]  # a worker's slot: a view into shared memory
        data = [b"\xff\xd8" + os.urandom(150_000), bytearray(b"small"), slot, b""]
        paths = [tmp_path / "ep_0" / "sub" / "000.jpg", tmp_path / "ep_0" / "001.jpg",
                 tmp_path / "ep_0" / "sub" / "002.jpg", tmp_path / "empty.jpg"]
        errors = write_files([(str(paths[0]), data[0], True), (str(paths[1]), data[1], False),
                              (str(paths[2]), data[2], False), (str(paths[3]), data[3], False)])
        assert errors == [None, None, None, None]
        assert [p.read_bytes() for p in paths] == [bytes(d) for d in data]
        slot.release()
    finally:
        segment.close()
        segment.unlink()


def test_a_file_that_exists_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "000.jpg"
    path.write_bytes(b"x" * 10_000)
    assert write_files([(str(path), b"short", False)]) == [None]
    assert path.read_bytes() == b"short"
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_file_that_cannot_be_written_is_reported_and_the_rest_are_written(tmp_path: Path) -> None:
    (tmp_path / "a_folder.jpg").mkdir()
    blocker = tmp_path / "not_a_folder"
    blocker.write_bytes(b"")
    ok = tmp_path / "ok" / "000.jpg"
    errors = write_files([(str(tmp_path / "missing" / "000.jpg"), b"a", False),  # its folder is not made
                          (str(tmp_path / "a_folder.jpg"), b"b", False),
                          (str(blocker / "000.jpg"), b"c", True),  # its folder cannot be made
                          (str(ok), b"d", True)])
    assert errors[0] == f"000.jpg: [Errno 2] No such file or directory: '{tmp_path / 'missing' / '000.jpg'}'"
    assert errors[1] is not None and errors[1].startswith("a_folder.jpg: [Errno 21] Is a directory")
    assert errors[2] is not None and errors[2].startswith("000.jpg: [Errno 20] Not a directory")
    assert errors[3] is None and ok.read_bytes() == b"d"


def test_items_of_the_wrong_shape_raise_before_anything_is_written(tmp_path: Path) -> None:
    first = tmp_path / "000.jpg"
    with pytest.raises(TypeError, match="item 1 is not a"):
        write_files([(str(first), b"a", False), (str(tmp_path / "b"), b"b")])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        write_files([(str(first), "not a buffer", False)])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        write_files([(None, b"a", False)])  # type: ignore[list-item]
    assert not first.exists()
    assert write_files([]) == []
