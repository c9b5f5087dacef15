"""Compiled copies of Spark's Python package, so a local job's driver does not compile PySpark on every start.

``spark-submit`` puts the installation's ``python/lib/pyspark.zip`` (and py4j's zip) first on the driver's
Python path, and a zip holds only source: Python compiles every PySpark module the job imports, ~0.4–0.7 s
before the session even starts, in every job, whether or not pyspark is also installed with compiled files.
:func:`build_compiled_copies` (run by the class archive's build) writes a copy of each such zip with the
compiled bytecode of its modules added (``<archive>.python/<name>.compiled.zip``); the archive's settings put
the copies first through ``spark.submit.pyFiles``, and Python imports the bytecode instead of compiling.

A copy holds every entry of its source, byte for byte, plus one ``.pyc`` per module (PEP 552 unchecked-hash
format; test modules are left as source) and a marker naming the zip it was made from with a fingerprint of
its entries (name, CRC, size). Each job calls :func:`drop_stale_copies` before it imports pyspark: a copy whose
source is not on the path, or differs from the one there (Spark upgraded, another installation), leaves the
path and the job imports the installation's own files. A driver on another Python version than the build's
reads the copy's sources, the same files as the installation's, compiled as before.

This module imports nothing from pyspark (it must run before pyspark is imported).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import sys
import warnings
import zipfile
from collections.abc import MutableMapping, MutableSequence
from pathlib import Path
from typing import Any

__all__ = ["COPY_SUFFIX", "MARKER", "build_compiled_copies", "compiled_copies", "drop_stale_copies",
           "fingerprint", "pyc_bytes"]

#: The end of a copy's file name (``pyspark.zip`` → ``pyspark.compiled.zip``): how the path check knows one.
COPY_SUFFIX = ".compiled.zip"
#: The copy's entry recording its source: ``{"source": <zip name>, "fingerprint": ..., "magic": ...}``.
MARKER = "babelqueue-compiled.json"
#: PEP 552 flags: a hash-based .pyc whose source is not checked (the copy's source is the bytes compiled).
_UNCHECKED_HASH = 0b01


def fingerprint(zip_path: str | os.PathLike[str]) -> str:
    """A digest of a zip's entries (name, CRC-32, size, in name order): equal for zips with the same files,
    read from the central directory alone (a few milliseconds for PySpark's ~1,000 entries)."""
    with zipfile.ZipFile(zip_path) as archive:
        entries = sorted(f"{info.filename}\t{info.CRC}\t{info.file_size}" for info in archive.infolist()
                         if info.filename != MARKER)
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def pyc_bytes(source: bytes, filename: str) -> bytes | None:
    """``source`` compiled for this Python, as an unchecked-hash ``.pyc`` (PEP 552: magic, flags, source hash,
    marshalled code); ``None`` when this Python cannot compile it (the module stays as source)."""
    try:
        with warnings.catch_warnings():  # Spark's sources carry a few SyntaxWarnings; they are not ours to report
            warnings.simplefilter("ignore")
            code = compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    header = importlib.util.MAGIC_NUMBER + _UNCHECKED_HASH.to_bytes(4, "little") + importlib.util.source_hash(source)
    return header + marshal.dumps(code)


def _is_test_module(name: str) -> bool:
    return "/tests/" in f"/{name}" or name.rsplit("/", 1)[-1].startswith("test_")


def _marker(copy: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        with zipfile.ZipFile(copy) as archive:
            marker = json.loads(archive.read(MARKER))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return marker if isinstance(marker, dict) else None


def _write_copy(source: Path, target: Path, marker: dict[str, Any]) -> None:
    """Write ``source`` with its modules' bytecode and ``marker`` to ``target`` (through a temporary file
    renamed into place)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with zipfile.ZipFile(source) as original, zipfile.ZipFile(partial, "w") as copy:
            names = {info.filename for info in original.infolist()}
            for info in original.infolist():
                data = original.read(info)
                copy.writestr(info, data)
                name = info.filename
                if name.endswith(".py") and f"{name}c" not in names and not _is_test_module(name):
                    compiled = pyc_bytes(data, os.path.join(target, name))
                    if compiled is not None:
                        entry = zipfile.ZipInfo(f"{name}c", info.date_time)
                        copy.writestr(entry, compiled, compress_type=zipfile.ZIP_DEFLATED)
            copy.writestr(zipfile.ZipInfo(MARKER, (1980, 1, 1, 0, 0, 0)), json.dumps(marker, sort_keys=True))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def compiled_copies(folder: str | os.PathLike[str]) -> list[str]:
    """The compiled copies in ``folder`` (``*.compiled.zip``, in name order), or ``[]``."""
    path = Path(folder)
    return sorted(str(copy) for copy in path.glob(f"*{COPY_SUFFIX}")) if path.is_dir() else []


def build_compiled_copies(python_lib: str | os.PathLike[str], folder: str | os.PathLike[str]) -> list[str]:
    """Write a compiled copy of every zip in an installation's ``python/lib`` (``pyspark.zip``,
    ``py4j-*-src.zip``) to ``folder``, and remove any other copy there; returns the copies' paths.

    A copy already made from the same source for this Python is left in place (a running job may be reading
    it); no zip to copy leaves no folder.

    :param python_lib: the Spark installation's ``python/lib`` (``$SPARK_HOME/python/lib``, or pyspark's own).
    :param folder: where the copies go (the class archive's ``<archive>.python``).
    """
    sources = sorted(Path(python_lib).glob("*.zip")) if Path(python_lib).is_dir() else []
    target_folder = Path(folder)
    made = set()
    for source in sources:
        if source.name.endswith(COPY_SUFFIX):
            continue
        target_folder.mkdir(parents=True, exist_ok=True)
        target = target_folder / f"{source.name[:-len('.zip')]}{COPY_SUFFIX}"
        marker = {"source": source.name, "fingerprint": fingerprint(source),
                  "magic": importlib.util.MAGIC_NUMBER.hex()}
        if _marker(target) != marker:
            _write_copy(source, target, marker)
        made.add(target.name)
    for stale in target_folder.glob(f"*{COPY_SUFFIX}") if target_folder.is_dir() else ():
        if stale.name not in made:
            stale.unlink()
    if target_folder.is_dir() and not made and not any(target_folder.iterdir()):
        target_folder.rmdir()
    return compiled_copies(target_folder)


def drop_stale_copies(path: MutableSequence[str] | None = None,
                      modules: MutableMapping[str, Any] | None = None) -> list[str]:
    """Take every compiled copy off the Python path unless the zip it was made from is on the path too, with
    the same entries; returns the entries taken off (each also noted on stderr, with what to do).

    Call it before anything imports pyspark (the jobs do, first thing); once pyspark is imported it does
    nothing, since the modules are loaded by then.

    :param path: the path to check (default ``sys.path``), changed in place.
    :param modules: the loaded modules (default ``sys.modules``).
    """
    path = sys.path if path is None else path
    if "pyspark" in (sys.modules if modules is None else modules):
        return []
    dropped = []
    for copy in [entry for entry in path if entry.endswith(COPY_SUFFIX)]:
        marker = _marker(copy)
        name = marker.get("source") if marker else None
        source = next((entry for entry in path if name and os.path.basename(entry) == name), None)
        try:
            current = source is not None and fingerprint(source) == marker["fingerprint"]  # type: ignore[index]
        except (OSError, zipfile.BadZipFile):
            current = False
        if not current:
            path.remove(copy)
            dropped.append(copy)
            why = (f"it was made from another {name}" if source else f"{name or 'its source'} is not on the path")
            print(f"babelqueue: not using {copy}: {why}; importing the installation's own files (rebuild the "
                  "class archive: python -m airflow_provider_babelqueue.spark.class_archive)", file=sys.stderr)
    return dropped
