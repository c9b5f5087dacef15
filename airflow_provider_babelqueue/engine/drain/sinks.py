"""Where drain records go: durable local files and object-storage streams, and how drain files are named.

Durability per sink: :class:`LocalFileSink` writes a batch, flushes and ``fsync``-s it (and fsyncs the
directory when it creates the file), then the batch is acked. :class:`StreamSink` (object storage) only knows
its data is stored when ``close`` returns, so its acks wait for the end of the run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import IO, Protocol

__all__ = ["LocalFileSink", "Sink", "StreamSink", "file_name", "safe_segment"]

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class Sink(Protocol):
    """Where drain records go. ``durable_batches`` says whether :meth:`sync` makes the data durable
    (then each batch is acked after it); otherwise only a completed :meth:`close` does."""

    durable_batches: bool
    location: str

    def write(self, data: bytes) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...

    def abort(self, durable_size: int) -> None: ...


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalFileSink:
    """A new local file, written with ``os.write`` and made durable with ``fsync`` per batch.

    The file is created exclusively (an existing file is never overwritten) and its directory entry is
    fsynced, so after :meth:`sync` returns both the data and the file's name survive a power cut.

    :param path: the file to create; missing parent directories are created.
    """

    durable_batches = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.location = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(self.location))
        os.makedirs(parent, exist_ok=True)
        try:
            self._fd: int | None = os.open(self.location, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise FileExistsError(f"drain destination {self.location} exists already; a drain never overwrites "
                                  "a file (give a folder, or a new file name)") from None
        _fsync_dir(parent)

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"drain file {self.location} is closed already")
        return self._fd

    def write(self, data: bytes) -> None:
        fd = self._open_fd()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def sync(self) -> None:
        os.fsync(self._open_fd())

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def abort(self, durable_size: int) -> None:
        """Cut the file back to its last durable size (records of messages that go back to the DLQ)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, durable_size)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None


class StreamSink:
    """Any writable binary stream, e.g. ``ObjectStoragePath.open("wb")`` for S3/GCS/Azure Blob.

    Object stores publish an object only when its upload completes, so data counts as durable only once
    :meth:`close` returned; the drain acks after that. :meth:`abort` discards the upload where the stream
    can (fsspec's ``discard``), else closes it (a partial object then holds duplicates, never losses).

    :param opener: returns the open binary stream; called once, immediately.
    :param location: the URL, for logs and the result.
    """

    durable_batches = False

    def __init__(self, opener: Callable[[], IO[bytes]], location: str) -> None:
        self.location = location
        self._stream: IO[bytes] | None = opener()

    def _open_stream(self) -> IO[bytes]:
        if self._stream is None:
            raise ValueError(f"drain stream {self.location} is closed already")
        return self._stream

    def write(self, data: bytes) -> None:
        self._open_stream().write(data)

    def sync(self) -> None:
        self._open_stream().flush()

    def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def abort(self, durable_size: int) -> None:
        if self._stream is None:
            return
        stream, self._stream = self._stream, None
        discard = getattr(stream, "discard", None)
        if callable(discard):
            discard()
        else:
            stream.close()


def safe_segment(text: str) -> str:
    """``text`` with runs of characters unsafe in object keys and Hadoop paths (``:``, ``+``, spaces, ``/``)
    replaced by ``_``, so a run id can name a file or a folder."""
    return _SAFE.sub("_", text).strip("_")


def file_name(run_id: str | None, unique: str) -> str:
    """``dlq-<run id, or UTC time>-<unique>.jsonl``, with characters unsafe in object keys replaced."""
    stamp = run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"dlq-{safe_segment(stamp)}-{unique}.jsonl"
