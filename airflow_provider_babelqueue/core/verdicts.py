"""Print the consumer verdict for envelope files: accepted, or the reason it would be quarantined.

Usage::

    python -m airflow_provider_babelqueue.verdicts PATH [PATH ...]

A PATH is a JSON file or a folder (its ``*.json`` files, and ``fixtures/`` when it holds a conformance
``manifest.json``). Exit status 0 when every file was read, 2 when a path does not exist. A rejected
envelope is not an error here: this tool reports, it does not judge.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import envelope as bq
from .errors import EnvelopeDecodeError

__all__ = ["main", "verdict_of"]


def verdict_of(body: bytes) -> tuple[bool, str, str, str]:
    """``(accepted, reason, urn, meta_id)`` for one raw body; undecodable bodies get reason ``poison``."""
    try:
        env = bq.decode(body)
    except EnvelopeDecodeError as exc:
        return False, f"{bq.Reason.POISON} ({exc})", "", ""
    reason = bq.check(env)
    return reason is None, str(reason or ""), bq.urn_of(env), bq.meta_id_of(env)


def _files(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            folder = path / "fixtures" if (path / "manifest.json").is_file() else path
            yield from sorted(p for p in folder.glob("*.json") if p.name != "manifest.json")
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"{raw}: no such file or folder")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        files = list(_files(args))
    except FileNotFoundError as exc:
        print(f"verdicts: {exc}", file=sys.stderr)
        return 2
    width = max((len(f.name) for f in files), default=4)
    print(f"{'file':<{width}}  {'verdict':<8}  {'reason':<28}  urn")
    accepted = 0
    for path in files:
        ok, reason, urn, _ = verdict_of(path.read_bytes())
        accepted += ok
        print(f"{path.name:<{width}}  {'accept' if ok else 'reject':<8}  {reason or '-':<28}  {urn or '-'}")
    print(
        f"{accepted} accepted, {len(files) - accepted} rejected (rejected messages are dead-lettered with "
        "that reason, never dropped)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
