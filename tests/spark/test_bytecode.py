"""Compiled copies of Spark's Python zips: exact contents, imported as bytecode, and dropped when stale."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from airflow_provider_babelqueue.spark import recommended_conf
from airflow_provider_babelqueue.spark.bytecode import (
    MARKER,
    build_compiled_copies,
    drop_stale_copies,
    fingerprint,
    pyc_bytes,
)
from airflow_provider_babelqueue.spark.class_archive import PY_FILES, add_driver_conf, archive_conf
from tests.spark.conftest import fake_archive

DATE = (2024, 5, 6, 7, 8, 10)
SOURCES = {
    "pkgx/__init__.py": b"VERSION = '1.0'\n",
    "pkgx/mod.py": b"def answer():\n    return 6 * 7\n",
    "pkgx/bad.py": b"def broken(:\n",  # this Python cannot compile it: it stays source only
    "pkgx/tests/__init__.py": b"",
    "pkgx/tests/test_mod.py": b"assert True\n",
    "pkgx/data/conditions.json": b'{"A": 1}',
}


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, DATE), data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def _entries(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def _python(code: str, *path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_copy_holds_every_source_entry_and_the_modules_bytecode(tmp_path: Path) -> None:
    lib = tmp_path / "python" / "lib"
    source = _zip(lib / "pkgx.zip", SOURCES)
    _zip(lib / "helper-0.1-src.zip", {"helper.py": b"X = 1\n"})
    cache = tmp_path / "cache"
    copies = build_compiled_copies(lib, cache)
    assert copies == [str(cache / "helper-0.1-src.compiled.zip"), str(cache / "pkgx.compiled.zip")]
    entries = _entries(Path(copies[1]))
    # every source entry, byte for byte and in order; bytecode for the modules but the tests and the one that
    # does not compile; the marker last
    assert list(entries) == ["pkgx/__init__.py", "pkgx/__init__.pyc", "pkgx/mod.py", "pkgx/mod.pyc", "pkgx/bad.py",
                             "pkgx/tests/__init__.py", "pkgx/tests/test_mod.py", "pkgx/data/conditions.json", MARKER]
    assert {name: entries[name] for name in SOURCES} == SOURCES
    with zipfile.ZipFile(copies[1]) as archive:
        assert {info.date_time for info in archive.infolist() if info.filename != MARKER} == {DATE}
    pyc = entries["pkgx/mod.pyc"]
    # PEP 552: this Python's magic, flags 0b01 (hash-based, unchecked), the source's hash, then the code
    assert pyc[:4] == importlib.util.MAGIC_NUMBER and pyc[4:8] == b"\x01\x00\x00\x00"
    assert pyc[8:16] == importlib.util.source_hash(SOURCES["pkgx/mod.py"])
    assert pyc == pyc_bytes(SOURCES["pkgx/mod.py"], os.path.join(copies[1], "pkgx/mod.py"))
    assert json.loads(entries[MARKER]) == {"source": "pkgx.zip", "fingerprint": fingerprint(source),
                                           "magic": importlib.util.MAGIC_NUMBER.hex()}
    assert fingerprint(copies[1]) != fingerprint(source)  # the copy has more entries than its source
    # Python imports the bytecode (its __file__ is the .pyc), and the package's data as before
    done = _python("import importlib.resources, pkgx.mod; print(pkgx.mod.__file__, pkgx.mod.answer(), "
                   "importlib.resources.files('pkgx').joinpath('data/conditions.json').read_text())", Path(copies[1]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [os.path.join(copies[1], "pkgx", "mod.pyc"), "42", '{"A":', "1}"]


def test_a_second_build_keeps_a_current_copy_and_removes_the_rest(tmp_path: Path) -> None:
    lib, cache = tmp_path / "lib", tmp_path / "cache"
    _zip(lib / "pkgx.zip", SOURCES)
    (copy,) = build_compiled_copies(lib, cache)
    first = os.stat(copy)
    (cache / "gone.compiled.zip").write_bytes(b"left by an older installation")
    assert build_compiled_copies(lib, cache) == [copy]
    assert os.stat(copy).st_ino == first.st_ino  # the same file: a running job may be reading it
    assert sorted(p.name for p in cache.iterdir()) == ["pkgx.compiled.zip"]  # no stale copy, no temporary file
    _zip(lib / "pkgx.zip", {**SOURCES, "pkgx/mod.py": b"def answer():\n    return 0\n"})  # an upgrade
    build_compiled_copies(lib, cache)
    assert _entries(Path(copy))["pkgx/mod.py"] == b"def answer():\n    return 0\n"
    (lib / "pkgx.zip").unlink()
    assert build_compiled_copies(lib, cache) == [] and not cache.exists()  # nothing to copy: no folder


def test_a_copy_stays_on_the_path_only_with_the_zip_it_was_made_from(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    source = _zip(tmp_path / "spark" / "pkgx.zip", SOURCES)
    (copy,) = build_compiled_copies(source.parent, tmp_path / "cache")
    path = [copy, str(source), "/somewhere/else"]
    assert drop_stale_copies(path, modules={}) == [] and path == [copy, str(source), "/somewhere/else"]
    assert capsys.readouterr().err == ""
    # pyspark already imported: too late to change anything, so nothing changes
    other = _zip(tmp_path / "other" / "pkgx.zip", {**SOURCES, "pkgx/mod.py": b"def answer():\n    return 0\n"})
    path = [copy, str(other)]
    assert drop_stale_copies(path, modules={"pyspark": object()}) == [] and path == [copy, str(other)]
    # another installation's zip of that name (one changed module): the copy goes, and stderr says why
    assert drop_stale_copies(path, modules={}) == [copy] and path == [str(other)]
    assert f"not using {copy}: it was made from another pkgx.zip" in capsys.readouterr().err
    # its source not on the path at all
    path = [copy, "/opt/lib/python"]
    assert drop_stale_copies(path, modules={}) == [copy] and path == ["/opt/lib/python"]
    assert "pkgx.zip is not on the path" in capsys.readouterr().err
    # an unreadable copy
    broken = tmp_path / "broken.compiled.zip"
    broken.write_bytes(b"not a zip")
    path = [str(broken), str(source)]
    assert drop_stale_copies(path, modules={}) == [str(broken)] and path == [str(source)]
    # what the jobs get: the installation's own module, imported from its source
    done = _python("from airflow_provider_babelqueue.spark.bytecode import drop_stale_copies\n"
                   "drop_stale_copies()\nimport pkgx.mod\nprint(pkgx.mod.__file__, pkgx.mod.answer())",
                   Path(copy), other, Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(other / "pkgx" / "mod.py"), "0"]


def test_a_driver_on_another_python_reads_the_copys_sources(tmp_path: Path) -> None:
    (copy,) = build_compiled_copies(_zip(tmp_path / "lib" / "pkgx.zip", SOURCES).parent, tmp_path / "cache")
    entries = _entries(Path(copy))
    foreign = tmp_path / "foreign.compiled.zip"
    _zip(foreign, {name: (b"\x00\x00\r\n" + data[4:] if name.endswith(".pyc") else data)  # another magic
                   for name, data in entries.items()})
    done = _python("import pkgx.mod; print(pkgx.mod.__file__, pkgx.mod.answer())", foreign)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [os.path.join(foreign, "pkgx", "mod.py"), "42"]


def test_the_archives_compiled_copies_go_first_on_the_python_path(tmp_path: Path) -> None:
    archive = fake_archive(tmp_path, python=("pyspark.compiled.zip", "py4j-0.10.9.9-src.compiled.zip", "notes.txt"))
    folder = tmp_path / "driver.jsa.python"
    copies = [str(folder / "py4j-0.10.9.9-src.compiled.zip"), str(folder / "pyspark.compiled.zip")]
    assert archive_conf(archive)[PY_FILES] == ",".join(copies)
    assert recommended_conf("local[2]", class_archive=str(archive))[PY_FILES] == ",".join(copies)
    mine = recommended_conf("local[2]", {PY_FILES: "/opt/deps.zip"}, class_archive=str(archive))
    assert mine[PY_FILES] == ",".join([*copies, "/opt/deps.zip"])  # first: found before the installation's zip
    assert add_driver_conf({PY_FILES: "/opt/deps.zip"}, {}) == {PY_FILES: "/opt/deps.zip"}
    assert PY_FILES not in recommended_conf("yarn", class_archive=str(archive))
    for name in os.listdir(folder):
        os.unlink(folder / name)
    assert PY_FILES not in archive_conf(archive)  # an archive built before the copies: no setting
