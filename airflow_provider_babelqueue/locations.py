"""Where a pipeline's files live: a local path (or ``file://`` URL), or an object-storage URL.

The output root, the drain's pending folder and the report the plugin serves may each be either. One rule tells
them apart everywhere: a ``file://`` URL is a local path, any other ``scheme://`` is object storage (opened with
Airflow's ``ObjectStoragePath``). Pure: no Airflow import.
"""

from __future__ import annotations

__all__ = ["is_object_storage", "local_path"]

_FILE = "file://"


def is_object_storage(location: str) -> bool:
    """True for a URL with a scheme other than ``file``, e.g. ``s3://bucket/runs``."""
    return "://" in location and not location.startswith(_FILE)


def local_path(location: str) -> str:
    """A local location without its ``file://`` prefix (unchanged when it has none)."""
    return location[len(_FILE):] if location.startswith(_FILE) else location
