"""Pages of a dead-letter queue on real brokers (``engine/browse.py``): positions, filters, the scan bound, what
triage would say about each dead letter, and that browsing removes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, NotSupportedError
from airflow_provider_babelqueue.core.fingerprint import read_dead_letter
from airflow_provider_babelqueue.core.peer import poison_wrapper
from airflow_provider_babelqueue.engine.browse import DeadLetterQuery, browse_page, dead_letter_raw
from tests.bindings.conftest import FACTORIES, reserve_all

PAGED = ["sql-sqlite", "sql-postgresql", "redis"]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[str], Binding]]:
    cleanups: list[Callable[[], None]] = []
    yield lambda kind: FACTORIES[kind](tmp_path, cleanups)
    for cleanup in reversed(cleanups):
        cleanup()


def _fill(binding: Binding, queue_name: str) -> list[bytes]:
    """12 dead letters: 4 timeouts (orders, php), 4 refusals (billing), 3 unknown URNs, 1 poison; their bytes."""
    bodies = []
    for n in range(11):
        urn = "urn:babel:orders:created" if n < 4 else "urn:babel:billing:charged" if n < 8 else "urn:babel:x:y"
        env = bq.make_envelope(urn, {"n": n}, queue_name=queue_name)
        if n < 4:
            env["meta"]["lang"] = "php"
        bodies.append(bq.encode(env))
    bodies.append(b"\xff not json")
    for body in bodies:
        binding.publish(body, queue_name)
    for message in reserve_all(binding, queue_name, len(bodies)):
        n = message.envelope["data"]["n"] if message.envelope else None
        if n is None:
            binding.dead_letter(message, bq.Reason.POISON, error="body is not JSON")
        elif n < 4:
            binding.dead_letter(message, bq.Reason.FAILED, error=f"timeout after {n}s for order 10{n}",
                                exception="App\\Exceptions\\GatewayTimeout")
        elif n < 8:
            binding.dead_letter(message, bq.Reason.FAILED, error=f"card {n} refused", exception="ValueError")
        else:
            binding.dead_letter(message, bq.Reason.UNKNOWN_URN, error="no handler")
    return bodies


@pytest.mark.parametrize("kind", PAGED)
def test_pages_filter_and_remove_nothing(make: Callable[[str], Binding], kind: str) -> None:
    binding = make(kind)
    queue = "orders"
    _fill(binding, queue)
    whole = browse_page(binding, queue, limit=100)
    assert (whole.depth, whole.scanned, len(whole.entries), whole.next_position) == (12, 12, 12, None)
    assert [e.position for e in whole.entries] == list(range(12))
    first = browse_page(binding, queue, limit=5)
    second = browse_page(binding, queue, start=first.next_position or 0, limit=5)
    assert first.next_position == 5 and [e.position for e in second.entries] == [5, 6, 7, 8, 9]
    assert [e.meta_id for e in first.entries + second.entries] == [e.meta_id for e in whole.entries[:10]]

    def page(**query: object) -> list[int]:
        return [e.position for e in browse_page(binding, queue, DeadLetterQuery(**query), limit=100).entries]  # type: ignore[arg-type]

    by = {e.position: e for e in whole.entries}
    timeouts = [p for p, e in by.items() if e.exception_type == "GatewayTimeout"]
    assert len(timeouts) == 4
    assert page(reasons=("unknown_urn",)) == [p for p, e in by.items() if e.reason == "unknown_urn"] != []
    assert page(urns=("urn:babel:orders:*",)) == timeouts
    assert page(exception_types=("GatewayTimeout",)) == page(exception_types=("App\\Exceptions\\GatewayTimeout",))
    assert page(exception_types=("GatewayTimeout",)) == timeouts
    assert page(langs=("php",)) == timeouts
    assert page(text="REFUSED") == [p for p, e in by.items() if e.exception == "ValueError"]
    assert len({by[p].fingerprint for p in timeouts}) == 1  # "timeout after <n>s for order <n>"
    assert page(fingerprints=(by[timeouts[0]].fingerprint[:6],)) == timeouts
    assert page(reasons=("poison",)) == [p for p, e in by.items() if e.poison] and len(page(reasons=("poison",))) == 1
    # every dead letter names its queue: a poison body in its wrapper's block (Redis stores the wrapper; the SQL
    # table keeps the bytes bare with the queue in a column, and reads as the same wrapper)
    assert page(original_queues=("orders",)) == list(range(12))
    # each entry says what triage says about the same bytes
    for entry in whole.entries:
        raw = dead_letter_raw(binding, queue, entry.position)
        assert raw is not None
        facts = read_dead_letter(raw)
        assert (entry.fingerprint, entry.reason, entry.meta_id) == (facts.fingerprint, facts.reason, facts.meta_id)
    # a rare filter stops at the scan bound and says where to go on from
    bounded = browse_page(binding, queue, DeadLetterQuery(reasons=("poison",)), limit=10, max_scan=3)
    assert (bounded.entries, bounded.scanned, bounded.stopped_by, bounded.next_position) == ([], 3, "max_scan", 3)
    assert binding.dead_letter_depth(queue) == 12  # nothing was taken


def test_a_broker_that_cannot_browse_says_so(make: Callable[[str], Binding]) -> None:
    binding = make("rabbitmq")
    with pytest.raises(NotSupportedError, match="cannot read a dead-letter queue without taking its messages"):
        browse_page(binding, "orders")


def test_a_head_only_broker_serves_its_head(make: Callable[[str], Binding]) -> None:
    binding = make("azure-service-bus")
    _fill(binding, "orders")
    page = browse_page(binding, "orders", limit=100)
    assert page.head_only and len(page.entries) == 12 and page.next_position is None
    assert binding.dead_letter_depth("orders") == 12


@pytest.mark.parametrize("kind", PAGED)
def test_a_page_reads_what_a_drain_reads(make: Callable[[str], Binding], kind: str) -> None:
    """The console's bytes are a drain's: on SQL a poison body kept bare (its reason, error and time in the
    columns) reads as the poison wrapper of its exact bytes, with the consumer's error, as Redis stores it."""
    binding = make(kind)
    _fill(binding, "orders")
    pages = binding.browse_dead_letter_bytes("orders", 0, 100)
    assert pages == [message.body for message in binding.browse_dead_letters("orders", limit=100)]
    after = binding.dead_letter_bytes_after("orders", None, 100)
    assert after is not None and after[0] == pages
    wrapper = poison_wrapper(pages[11])
    assert wrapper is not None and wrapper.raw == b"\xff not json"
    assert (wrapper.dead_letter["reason"], wrapper.dead_letter["error"]) == ("poison", "body is not JSON")
    assert isinstance(wrapper.dead_letter["failed_at"], int) and wrapper.dead_letter["original_queue"] == "orders"
    entry = browse_page(binding, "orders", DeadLetterQuery(reasons=("poison",))).entries[0]
    assert (entry.error, entry.failed_at) == ("body is not JSON", wrapper.dead_letter["failed_at"])


@pytest.mark.parametrize("kind", PAGED)
def test_discard_removes_one_stored_copy_of_each_body_present(make: Callable[[str], Binding], kind: str) -> None:
    binding = make(kind)
    _fill(binding, "orders")
    stored = binding.browse_dead_letter_bytes("orders", 0, 100)
    assert stored is not None and len(stored) == 12 and binding.can_discard
    assert binding.discard_dead_letters("orders", [stored[1], stored[1], stored[11], b"never stored"]) == 2
    assert binding.browse_dead_letter_bytes("orders", 0, 100) == [b for n, b in enumerate(stored) if n not in (1, 11)]
    assert binding.dead_letter_depth("orders") == 10


@pytest.mark.parametrize("kind", PAGED)
def test_dead_letters_failed_since_counts_from_the_newest(make: Callable[[str], Binding], kind: str) -> None:
    binding = make(kind)
    before = bq.now_ms()
    _fill(binding, "orders")
    assert binding.dead_letters_failed_since("orders", before) == (12, True)
    assert binding.dead_letters_failed_since("orders", bq.now_ms() + 1) == (0, True)
    assert binding.dead_letters_failed_since("other", before) == (0, True)
    capped = binding.dead_letters_failed_since("orders", before, max_scan=5)
    assert capped == ((5, False) if kind == "redis" else (12, True))  # SQL counts a column: never capped


@pytest.mark.parametrize("kind", PAGED)
def test_a_whole_queue_read_in_chunks_survives_removals(make: Callable[[str], Binding], kind: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's read (``MatchScan``) over the queue in chunks: every dead letter once, in order, while the matches
    of each chunk are removed as it goes (a discard job)."""
    from airflow_provider_babelqueue.engine import browse

    binding = make(kind)
    _fill(binding, "orders")
    stored = binding.browse_dead_letter_bytes("orders", 0, 100)
    assert stored is not None
    chunks: list[list[bytes]] = []
    read = binding.dead_letter_bytes_after("orders", None, 5)
    while read is not None and read[0]:
        chunks.append(read[0])
        read = binding.dead_letter_bytes_after("orders", read[1], 5)
    assert [len(c) for c in chunks] == [5, 5, 2] and sum(chunks, []) == stored

    monkeypatch.setattr(browse, "CHUNK", 5)  # chunks smaller than the queue, so removals happen between reads
    scan = browse.MatchScan(binding, "orders", DeadLetterQuery(reasons=("failed",)))
    removed: list[bytes] = []
    while not scan.done:
        matches = scan.next_chunk()
        assert binding.discard_dead_letters("orders", matches) == len(matches)
        scan.removed(len(matches))
        removed += matches
    assert scan.scanned == 12 and scan.matched == 8
    assert removed == stored[:8]  # the four timeouts and the four refusals, each once
    assert binding.browse_dead_letter_bytes("orders", 0, 100) == stored[8:]


@pytest.mark.parametrize("kind", PAGED)
def test_queue_names_lists_the_queues_with_messages_or_dead_letters(make: Callable[[str], Binding],
                                                                    kind: str) -> None:
    binding = make(kind)
    assert binding.queue_names() == []
    _fill(binding, "orders")  # dead letters only
    binding.publish(bq.encode(bq.make_envelope("urn:babel:billing:charged", {}, queue_name="billing")), "billing")
    [held] = reserve_all(binding, "billing", 1)  # reserved: a Redis list holds it under processing
    binding.publish(bq.encode(bq.make_envelope("urn:babel:x:y", {}, queue_name="audit.log")), "audit.log")
    assert binding.queue_names() == ["audit.log", "billing", "orders"]
    assert binding.queue_names(limit=2) == ["audit.log", "billing"]
    binding.ack(held)
