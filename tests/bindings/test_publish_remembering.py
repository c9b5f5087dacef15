"""``publish_remembering``: a batch and its ledger marks in one atomic step (SQL transaction, Redis MULTI/EXEC).

This is what makes a replay crash-proof when its ledger lives on the target (see the crash suite). Bindings
that cannot do it (other brokers, stores elsewhere) return ``False`` having done nothing.
"""

from __future__ import annotations

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import Binding, BindingError, PublishBatchError
from tests.bindings.conftest import Factory
from tests.conftest import take_all


def bodies_for(queue: str, count: int) -> list[bytes]:
    return [bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n}, queue_name=queue)) for n in range(count)]


ATOMIC = ["sql-sqlite", "sql-postgresql", "redis"]


@pytest.fixture
def atomic(make_binding: Factory) -> Binding:
    return make_binding()


@pytest.mark.parametrize("make_binding", ATOMIC, indirect=True)
def test_the_batch_and_its_marks_land_together(atomic: Binding, queue_name: str) -> None:
    ids, copies = atomic.seen_store("replay:orders"), atomic.seen_store("replay:orders:copies")
    bodies = bodies_for(queue_name, 1203)  # more than one RPUSH / INSERT chunk
    keys = [f"id-{n}" for n in range(1203)]
    assert atomic.publish_remembering(bodies, queue_name, [(copies, ["d1", "d2"]), (ids, keys)]) is True
    assert take_all(atomic, queue_name, timeout=0.1) == bodies
    assert ids.seen_many(keys) == set(keys) and copies.seen_many(["d1", "d2", "d3"]) == {"d1", "d2"}


@pytest.mark.parametrize("make_binding", ATOMIC, indirect=True)
def test_a_store_elsewhere_means_two_steps(atomic: Binding, make_binding: Factory, queue_name: str) -> None:
    other = make_binding().seen_store("elsewhere")
    assert atomic.publish_remembering(bodies_for(queue_name, 2), queue_name, [(other, ["k"])]) is False
    assert atomic.depth(queue_name) == 0 and not other.seen("k")  # nothing was done


@pytest.mark.parametrize("make_binding", ["sql-sqlite", "sql-postgresql"], indirect=True)
def test_a_failing_mark_rolls_the_batch_back(atomic: Binding, queue_name: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault inside the transaction after the rows were inserted. No real fault lands exactly there on demand,
    so the store's insert is made to raise (the only mock in this file)."""
    store = atomic.seen_store("replay:orders")

    def broken(conn: object, keys: object) -> None:
        raise BindingError("injected: the seen table refused the write")

    monkeypatch.setattr(store, "insert_keys", broken)
    with pytest.raises(PublishBatchError, match="none was stored") as caught:
        atomic.publish_remembering(bodies_for(queue_name, 3), queue_name, [(store, ["a"])])
    assert caught.value.failed == [0, 1, 2]
    assert atomic.depth(queue_name) == 0


@pytest.mark.parametrize("make_binding", ["redis"], indirect=True)
def test_a_redis_transaction_applies_nothing_when_the_connection_drops_before_exec(
    make_binding: Factory, queue_name: str
) -> None:
    binding = make_binding()
    store = binding.seen_store("replay:orders")
    pipe_class = type(binding.client.pipeline(transaction=True))
    original = pipe_class.execute

    def drop_then_execute(self: object, *args: object, **kwargs: object) -> object:
        # The client's connection is closed under the queued MULTI: EXEC never reaches the server.
        self.reset()  # type: ignore[attr-defined]
        raise __import__("redis").exceptions.ConnectionError("injected: connection lost before EXEC")

    pipe_class.execute = drop_then_execute  # fault injection: a connection lost between MULTI and EXEC
    try:
        with pytest.raises(PublishBatchError):
            binding.publish_remembering(bodies_for(queue_name, 3), queue_name, [(store, ["a"])])
    finally:
        pipe_class.execute = original
    assert binding.depth(queue_name) == 0 and not store.seen("a")
