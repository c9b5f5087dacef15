"""Drain files waiting for triage: the folder a dead letter moves into when it leaves the broker.

A move drain takes dead letters out of their DLQ. If the triage that should read the file then fails (or never
starts), the file must not be forgotten under a run's own folder: the next run would find an empty DLQ and skip.
So a pipeline drains into one *pending* folder per DAG, the triage reads every file waiting there, and only a
triage that succeeded moves the files it read into its run's folder. Until then they stay pending, and the next
run's triage reads them together with its own (triage drops duplicates by ``meta.id``).

The folder is local or any ``ObjectStoragePath`` URL, as the drain's destination is. Files are listed and moved,
never rewritten: a drain file is the evidence, byte for byte.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..locations import is_object_storage, local_path

__all__ = ["DRAIN_SUFFIXES", "carried_over", "file_key", "move_into", "waiting_files"]

#: The names a drain writes (``dlq-<run id>-<uuid>.jsonl``) and that a pending folder may hold.
DRAIN_SUFFIXES = (".jsonl", ".ndjson")


def _storage(path: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(path)


def file_key(path: str) -> str:
    """One spelling per file, to tell whether two paths name the same file (``file://`` and symlinks folded)."""
    text = str(path).strip()
    if is_object_storage(text):
        return text.rstrip("/")
    return os.path.realpath(os.path.expanduser(local_path(text)))


def waiting_files(folder: str) -> list[str]:
    """The drain files in ``folder`` (not its sub-folders), oldest name first; none when it does not exist.

    Names starting with ``.`` or ``_`` are skipped: a file still being written to object storage, or a marker.
    """
    text = str(folder).strip()
    if is_object_storage(text):
        base = _storage(text)
        if not base.exists():
            return []
        names = [entry for entry in base.iterdir() if entry.is_file()]
        found = [str(entry) for entry in names if _is_drain_file(entry.name)]
    else:
        local = Path(local_path(text)).expanduser()
        if not local.is_dir():
            return []
        found = [str(entry) for entry in local.iterdir() if entry.is_file() and _is_drain_file(entry.name)]
    return sorted(found, key=lambda path: (path.rsplit("/", 1)[-1], path))


def _is_drain_file(name: str) -> bool:
    return not name.startswith((".", "_")) and name.lower().endswith(DRAIN_SUFFIXES)


def move_into(paths: Iterable[str], folder: str) -> list[str]:
    """Move each file into ``folder`` (created if missing), keeping its name; returns the new paths.

    Local files are renamed when the folder is on the same file system (atomic), copied then removed otherwise.
    Object-storage files are moved by the file system's own move (a copy then a delete on most object
    stores). A file already in ``folder`` stays where it is.
    """
    text = str(folder).strip()
    moved: list[str] = []
    if is_object_storage(text):
        target = _storage(text)
        target.mkdir(parents=True, exist_ok=True)
        for path in paths:
            source = _storage(path) if is_object_storage(path) else _storage(f"file://{file_key(path)}")
            destination = target / source.name
            if file_key(str(destination)) != file_key(str(source)):
                source.move(destination)
            moved.append(str(destination))
        return moved
    local = Path(local_path(text)).expanduser()
    local.mkdir(parents=True, exist_ok=True)
    for path in paths:
        if is_object_storage(path):
            raise ValueError(f"cannot move {path} into the local folder {local}: give an object-storage archive")
        source = Path(file_key(path))
        destination = local / source.name
        if file_key(str(destination)) != str(source):
            shutil.move(source, destination)
        moved.append(str(destination))
    return moved


def carried_over(waiting: Sequence[str], given: Sequence[str]) -> list[str]:
    """The waiting files that are not among the ``given`` inputs: left by earlier runs."""
    keys = {file_key(path) for path in given}
    return [path for path in waiting if file_key(path) not in keys]
