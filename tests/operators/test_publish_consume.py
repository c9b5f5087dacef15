"""Publish and consume operators inside real DAGs under dag.test(), on every broker with a connection."""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.hooks import get_hook
from airflow_provider_babelqueue.operators.consume import BabelQueueConsumeOperator, resolve_handlers
from airflow_provider_babelqueue.operators.publish import BabelQueuePublishOperator, payloads_of, ready_envelopes_of
from tests.airflow_harness import run_dag, task_states, xcom
from tests.connections import ALL, define
from tests.operators import handlers

TRACE = "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b"


@pytest.fixture(params=ALL)
def conn_id(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return define(monkeypatch, request.param)


def test_publish_then_consume_in_one_dag(conn_id: str) -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    handlers.HANDLED.clear()
    with DAG(
        f"bq_publish_consume_{uuid.uuid4().hex[:6]}",
        schedule=None,
        start_date=datetime.datetime(2026, 1, 1),
        params={"urn": "urn:babel:orders:created", "queue": queue},
    ) as dag:
        single = BabelQueuePublishOperator(
            task_id="publish_single",
            babelqueue_conn_id=conn_id,
            queue_name="{{ params.queue }}",
            urn="{{ params.urn }}",
            data={"order_id": 1, "note": "run {{ run_id }}"},
            trace_id=TRACE,
        )
        batch = BabelQueuePublishOperator(
            task_id="publish_batch",
            babelqueue_conn_id=conn_id,
            queue_name=queue,
            urn="urn:babel:orders:created",
            data=[{"order_id": i} for i in range(2, 6)],
        )
        failing = BabelQueuePublishOperator(
            task_id="publish_failing",
            babelqueue_conn_id=conn_id,
            queue_name=queue,
            urn="urn:babel:orders:refund",
            data={"order_id": 99},
        )
        consume = BabelQueueConsumeOperator(
            task_id="consume",
            babelqueue_conn_id=conn_id,
            queue_name=queue,
            max_attempts=2,
            backoff="fixed",
            backoff_base=0,
            reserve_timeout=0.5,
            handlers={
                "urn:babel:orders:created": "tests.operators.handlers.record",
                "urn:babel:orders:refund": handlers.always_fail,
            },
        )
        single >> batch >> failing >> consume
    run = run_dag(dag)
    assert task_states(run) == {t: "success" for t in ("publish_single", "publish_batch", "publish_failing", "consume")}
    single_ids, batch_ids = xcom(run, "publish_single"), xcom(run, "publish_batch")
    assert len(single_ids) == 1 and len(batch_ids) == 4 and len(set(single_ids + batch_ids)) == 5
    assert xcom(run, "consume") == {
        "received": 7,
        "handled": 5,
        "retried": 1,
        "skipped_duplicates": 0,
        "deleted_unknown": 0,
        "released_unknown": 0,
        "unmatched": 0,
        "returned_unhandled": 0,
        "broker_errors": 0,
        "results_dropped": 0,
        "results_unserialisable": 0,
        "dead_lettered": {"failed": 1},
        "results": [],
    }
    by_id = {env["meta"]["id"]: env for env in handlers.HANDLED}
    assert sorted(by_id) == sorted(single_ids + batch_ids)
    first = by_id[single_ids[0]]
    assert first["trace_id"] == TRACE and first["job"] == "urn:babel:orders:created"
    assert first["meta"]["queue"] == queue and first["data"]["note"] == f"run {run.run_id}"
    assert [by_id[i]["data"]["order_id"] for i in batch_ids] == [2, 3, 4, 5]
    assert all(env["trace_id"] != TRACE for i, env in by_id.items() if i in batch_ids)
    hook = get_hook(conn_id)
    binding = hook.get_binding()
    try:
        dead = binding.reserve_dead_letter(queue, timeout=1)
        assert dead.envelope["data"] == {"order_id": 99}
        assert dead.envelope["dead_letter"]["reason"] == "failed"
        assert dead.envelope["dead_letter"]["exception"] == "TimeoutError"
        assert dead.envelope["dead_letter"]["error"] == "downstream timed out for order 99"
        assert dead.envelope["dead_letter"]["attempts"] == 2
        binding.ack(dead)
        assert binding.depth(queue) == 0 and binding.dead_letter_depth(queue) == 0
    finally:
        hook.close()


def test_fail_on_dead_letters_fails_the_task_after_pushing_the_summary() -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    with DAG(f"bq_fail_on_dl_{uuid.uuid4().hex[:6]}", schedule=None, start_date=datetime.datetime(2026, 1, 1)) as dag:
        BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn="urn:babel:unknown", data={}) >> (
            BabelQueueConsumeOperator(task_id="consume", queue_name=queue, handlers={}, fail_on_dead_letters=True)
        )
    run = run_dag(dag)
    assert task_states(run)["consume"] == "failed"
    assert xcom(run, "consume")["dead_lettered"] == {"unknown_urn": 1}


def test_publish_ready_envelopes_unchanged() -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    env = bq.make_envelope("urn:babel:orders:created", {"price": 1e-07}, queue_name=queue)
    raw = bq.encode(env).replace(b'"price":1e-07', b'"price":1e-7')  # another SDK's float format
    op = BabelQueuePublishOperator(task_id="p", queue_name=queue, envelopes=[raw, env])
    assert op.execute({}) == [env["meta"]["id"], env["meta"]["id"]]
    hook = get_hook()
    try:
        binding = hook.get_binding()
        first, second = binding.reserve(queue, timeout=1), binding.reserve(queue, timeout=1)
        assert first.body == raw  # forwarded bytes are never re-encoded
        assert second.body == bq.encode(env)
        binding.ack(first)
        binding.ack(second)
    finally:
        hook.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give either urn"),
        ({"urn": "u", "envelopes": []}, "give either urn"),
        ({"urn": "u", "delay": -1}, "delay must not be negative"),
    ],
)
def test_publish_argument_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BabelQueuePublishOperator(task_id="p", queue_name="q", **kwargs)


def test_publish_refuses_invalid_ready_envelopes() -> None:
    env = bq.make_envelope("urn:x", {})
    env["meta"]["schema_version"] = 2
    with pytest.raises(ValueError, match=r"envelopes\[0\] is not publishable: unsupported_schema_version"):
        BabelQueuePublishOperator(task_id="p", queue_name="q", envelopes=[env]).execute({})


def test_consume_argument_errors() -> None:
    with pytest.raises(ValueError, match="unbounded consumer never finishes"):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={}, stop_when_empty=False)
    with pytest.raises(ValueError, match="'linear'"):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={}, backoff="linear")
    with pytest.raises(ValueError, match="cannot import 'tests.operators.handlers.missing'"):
        resolve_handlers({"u": "tests.operators.handlers.missing"})
    with pytest.raises(ValueError, match="must be a callable or a dotted path"):
        resolve_handlers({"u": 42})  # type: ignore[dict-item]


def _taken(queue: str) -> list[bytes]:
    """Every body on ``queue`` of the embedded default, in order (each acked)."""
    hook = get_hook()
    bodies = []
    try:
        binding = hook.get_binding()
        while (message := binding.reserve(queue, timeout=0)) is not None:
            bodies.append(message.body)
            binding.ack(message)
    finally:
        hook.close()
    return bodies


def test_templated_json_text_is_published_as_json() -> None:
    """A template renders text: ``| tojson`` text of payloads and of ready envelopes is read as JSON, and the
    text of one encoded envelope is forwarded byte for byte."""
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    ready = bq.encode(bq.make_envelope("urn:babel:orders:created", {"order_id": 9, "note": "ready"}, trace_id=TRACE))
    with DAG(
        f"bq_publish_json_text_{uuid.uuid4().hex[:6]}",
        schedule=None,
        start_date=datetime.datetime(2026, 1, 1),
        params={"orders": [{"order_id": 1, "sku": "Ä-1"}, {"order_id": 2, "total": 12.5}], "ready": ready.decode()},
    ) as dag:
        batch = BabelQueuePublishOperator(
            task_id="batch", queue_name=queue, urn="urn:babel:orders:created", data="{{ params.orders | tojson }}"
        )
        one = BabelQueuePublishOperator(task_id="one", queue_name=queue, envelopes="{{ params.ready }}")
        listed = BabelQueuePublishOperator(
            task_id="listed", queue_name=queue, envelopes="{{ [params.ready] | tojson }}"
        )
        batch >> one >> listed
    run = run_dag(dag)
    assert task_states(run) == {"batch": "success", "one": "success", "listed": "success"}
    bodies = _taken(queue)
    payloads = [bq.decode(body)["data"] for body in bodies[:2]]
    assert payloads == [{"order_id": 1, "sku": "Ä-1"}, {"order_id": 2, "total": 12.5}]
    assert bodies[2:] == [ready, ready]
    assert xcom(run, "one") == xcom(run, "listed") == [bq.meta_id_of(bq.decode(ready))]


def test_python_text_of_a_value_publishes_it_and_other_text_fails_before_sending() -> None:
    """Without ``| tojson`` Jinja writes Python's text of the value; it reads back exactly. A dict holding a
    datetime renders text that cannot be read back: the task fails and nothing is sent."""
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    order = {"order_id": 1, "note": "it's \"quoted\" Ä", "paid": True, "coupon": None, "total": 0.1}
    with DAG(
        f"bq_publish_py_text_{uuid.uuid4().hex[:6]}",
        schedule=None,
        start_date=datetime.datetime(2026, 1, 1),
        params={"order": order},
    ) as dag:
        python_text = BabelQueuePublishOperator(
            task_id="python_text", queue_name=queue, urn="urn:x", data="{{ params.order }}"
        )
        unreadable = BabelQueuePublishOperator(
            task_id="unreadable", queue_name=queue, urn="urn:x", data="{{ {'at': macros.datetime(2026, 1, 1)} }}"
        )
        python_text >> unreadable
    run = run_dag(dag)
    assert task_states(run) == {"python_text": "success", "unreadable": "failed"}
    assert [bq.decode(body)["data"] for body in _taken(queue)] == [order]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "{'at': datetime.datetime(2026, 1, 1, 0, 0)}",
            r"rendered to text that is neither JSON nor a Python literal: \"\{'at': datetime.*\| tojson",
        ),
        ("None", r"data rendered to 'None', .*give the payload, or \{\} for an empty one"),
        ("  ", r"data rendered to '  '"),
        (5, r"data must be a dict \(one message\) or a list of dicts \(a batch\), got int"),
        ([{"a": 1}, None], r"data\[1\] must be a dict \(one message's payload\), got NoneType"),
        ('[{"a": 1}, "b"]', r"data\[1\] must be a dict"),
    ],
)
def test_publish_data_errors_name_the_fix(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BabelQueuePublishOperator(task_id="p", queue_name="q", urn="urn:x", data=data).execute({})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("envelopes", "message"),
    [
        ("[Envelope()]", r"envelopes must be a list of envelopes .* a Python literal: .*_as_native_obj=True"),
        ("None", r"envelopes rendered to 'None'"),
        (7, r"envelopes must be a list of envelopes \(dicts, or encoded bytes/str\), got int"),
        ([7], r"envelopes\[0\] must be an envelope dict or its encoded bytes/str, got int"),
        ([bq.encode(bq.make_envelope("urn:x", {})), b"\xef\xbb\xbf{}"],
         r"envelopes\[1\] is not an encoded envelope: The body is not valid JSON"),  # a byte-order mark
        (["{bad json"], r"envelopes\[0\] is not an encoded envelope: The body is not valid JSON"),
    ],
)
def test_publish_envelopes_errors_name_the_fix(envelopes: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BabelQueuePublishOperator(task_id="p", queue_name="q", envelopes=envelopes).execute({})  # type: ignore[arg-type]


def test_payloads_read_from_each_form() -> None:
    assert payloads_of(None) == [{}]
    assert payloads_of({"a": 1}) == [{"a": 1}]
    assert payloads_of(' {"a": 1} ') == [{"a": 1}]
    assert payloads_of('[{"a": 1}, {}]') == [{"a": 1}, {}]
    assert payloads_of([]) == []
    env = bq.make_envelope("urn:x", {})
    assert ready_envelopes_of(env) == [env]
    assert ready_envelopes_of(bq.encode(env)) == [bq.encode(env)]
    assert ready_envelopes_of(bq.encode(env).decode()) == [bq.encode(env).decode()]
    assert ready_envelopes_of(str([bq.encode(env)])) == [bq.encode(env)]  # an XCom of bytes, rendered
    assert ready_envelopes_of(str(bq.encode(env))) == [bq.encode(env)]
    assert payloads_of("[{'a': 1}, {'b': (2, 3)}]") == [{"a": 1}, {"b": (2, 3)}]


@pytest.mark.parametrize("conf", [{}, {"trace_id": TRACE}], ids=["no_conf", "conf_trace"])
def test_the_documented_trace_id_template_continues_a_trace_or_starts_new_ones(conf: dict) -> None:
    """``trace_id="{{ dag_run.conf.get('trace_id') }}"`` renders ``None`` in a run started without one: each
    message then starts its own trace, as when ``trace_id`` is not given."""
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    start = datetime.datetime(2026, 1, 1)
    with DAG(f"bq_publish_trace_{uuid.uuid4().hex[:6]}", schedule=None, start_date=start) as dag:
        BabelQueuePublishOperator(
            task_id="publish", queue_name=queue, urn="urn:x", data=[{"n": 1}, {"n": 2}],
            trace_id="{{ dag_run.conf.get('trace_id') }}",
        )
    run = run_dag(dag, run_conf=conf)
    assert task_states(run) == {"publish": "success"}
    traces = [bq.decode(body)["trace_id"] for body in _taken(queue)]
    if conf:
        assert traces == [TRACE, TRACE]
    else:
        assert len(set(traces)) == 2 and all(uuid.UUID(trace).version == 4 for trace in traces)


def test_an_urn_rendered_as_none_fails_before_sending() -> None:
    with pytest.raises(ValueError, match=r"urn rendered to 'None', .* give the message's URN"):
        BabelQueuePublishOperator(task_id="p", queue_name="q", urn="None", data={}).execute({})


def test_an_idempotency_store_rendered_as_unset_is_the_default_store() -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    ids = BabelQueuePublishOperator(task_id="p", queue_name=queue, urn="urn:x",
                                    data=[{"order_id": n, "amount": n} for n in (1, 2)]).execute({})
    summary = BabelQueueConsumeOperator(
        task_id="c", queue_name=queue, handlers={"urn:x": "tests.operators.handlers.order_total"},
        idempotency_conn_id="babelqueue_default", idempotency_store="None", reserve_timeout=0,
    ).execute({})
    assert summary["handled"] == 2
    hook = get_hook()
    try:
        binding = hook.get_binding()
        assert [binding.seen_store(f"consume:{queue}").seen(meta_id) for meta_id in ids] == [True, True]
        assert not any(binding.seen_store("None").seen(meta_id) for meta_id in ids)
    finally:
        hook.close()


def test_the_run_bounds_and_batch_size_are_templated() -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    start = datetime.datetime(2026, 1, 1)
    with DAG(f"bq_consume_bounds_{uuid.uuid4().hex[:6]}", schedule=None, start_date=start,
             params={"limit": 3, "batch": 2, "unset": None}) as dag:
        publish = BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn="urn:x",
                                            data=[{"order_id": n, "amount": n} for n in range(5)])
        bounded = BabelQueueConsumeOperator(
            task_id="bounded", queue_name=queue, handlers={"urn:x": "tests.operators.handlers.order_total"},
            max_messages="{{ params.limit }}", batch_size="{{ params.batch }}", max_seconds="{{ params.unset }}",
            stop_when_empty=False, reserve_timeout=0.2,
        )
        unbounded = BabelQueueConsumeOperator(
            task_id="unbounded", queue_name=queue, handlers={"urn:x": "tests.operators.handlers.order_total"},
            max_messages="{{ params.unset }}", stop_when_empty=False,
        )
        publish >> bounded >> unbounded
    run = run_dag(dag)
    assert task_states(run) == {"publish": "success", "bounded": "success", "unbounded": "failed"}
    assert [item["result"]["order_id"] for item in xcom(run, "bounded")["results"]] == [0, 1, 2]
    assert [bq.decode(body)["data"]["order_id"] for body in _taken(queue)] == [3, 4]  # the failed run took none


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_messages": "many"}, "max_messages must be a whole number, got 'many'"),
        ({"max_seconds": "-1"}, "max_seconds must be a finite number >= 0"),
        ({"batch_size": "0"}, "batch_size must be a whole number >= 1, got '0'"),
        ({"batch_size": 2.5}, "batch_size must be a whole number >= 1, got 2.5"),
        ({"max_messages": "None", "stop_when_empty": False}, "an unbounded consumer never finishes"),
    ],
)
def test_consume_bounds_are_checked_when_the_dag_is_parsed(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={}, **kwargs)


def test_a_handler_with_the_wrong_signature_fails_the_task_before_any_message_is_taken() -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    start = datetime.datetime(2026, 1, 1)
    with DAG(f"bq_consume_bad_handler_{uuid.uuid4().hex[:6]}", schedule=None, start_date=start) as dag:
        publish = BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn="urn:x", data=[{"n": 1}, {"n": 2}])
        consume = BabelQueueConsumeOperator(task_id="consume", queue_name=queue,
                                            handlers={"urn:x": "tests.operators.handlers.with_context"})
        publish >> consume
    run = run_dag(dag)
    assert task_states(run) == {"publish": "success", "consume": "failed"}
    assert [bq.decode(body)["attempts"] for body in _taken(queue)] == [0, 0]  # both still ready, never tried


def test_mapped_consumers_share_a_queue() -> None:
    """k consumers as mapped task instances of one operator (``partial().expand()``), each bounded by its own
    ``max_messages``: together they take every message once."""
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    start = datetime.datetime(2026, 1, 1)
    with DAG(f"bq_mapped_consumers_{uuid.uuid4().hex[:6]}", schedule=None, start_date=start) as dag:
        publish = BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn="urn:x",
                                            data=[{"order_id": n, "amount": n} for n in range(12)])
        consume = BabelQueueConsumeOperator.partial(
            task_id="consume", queue_name=queue, handlers={"urn:x": handlers.order_total}, reserve_timeout=0.2,
        ).expand(max_messages=[4, 4, 4])
        publish >> consume
    run = run_dag(dag)
    assert task_states(run) == {"publish": "success", "consume": "success"}
    summaries = [xcom(run, "consume", map_index=index) for index in range(3)]
    assert [summary["handled"] for summary in summaries] == [4, 4, 4]
    taken = sorted(item["result"]["order_id"] for summary in summaries for item in summary["results"])
    assert taken == list(range(12)) and _taken(queue) == []


def test_an_upstream_tasks_output_sizes_and_filters_a_consume_task() -> None:
    """``urns=plan["urns"]`` and ``max_messages=...output``: XComArgs are not checked when the DAG is parsed (they
    have no value yet) and are resolved as templated fields."""
    from airflow.sdk import task

    queue = f"orders-{uuid.uuid4().hex[:8]}"
    start = datetime.datetime(2026, 1, 1)
    with DAG(f"bq_consume_xcomarg_{uuid.uuid4().hex[:6]}", schedule=None, start_date=start) as dag:

        @task
        def limit() -> int:
            return 2

        @task
        def patterns() -> list[str]:
            return ["urn:babel:orders:*"]

        publish = BabelQueuePublishOperator(task_id="publish", queue_name=queue, urn="urn:babel:orders:created",
                                            data=[{"order_id": n, "amount": n} for n in range(3)])
        consume = BabelQueueConsumeOperator(
            task_id="consume", queue_name=queue, handlers={"urn:babel:orders:created": handlers.order_total},
            urns=patterns(), max_messages=limit(), reserve_timeout=0.2,
        )
        publish >> consume
    run = run_dag(dag)
    assert task_states(run)["consume"] == "success"
    assert [item["result"]["order_id"] for item in xcom(run, "consume")["results"]] == [0, 1]
    assert [bq.decode(body)["data"]["order_id"] for body in _taken(queue)] == [2]


def test_what_is_known_only_at_run_time_is_not_checked_at_parse_time() -> None:
    from airflow_provider_babelqueue.operators._params import is_template

    assert [is_template(v) for v in ("{{ x }}", "x", 3, None, True, ["a", "{{ y }}"], ["a"], {"a": 1}, b"{{")] == [
        True, False, False, False, False, True, False, False, False]
    assert is_template(object())  # an XComArg, a MappedArgument: resolved at run time
    assert not is_template(Path("/data/replay"))


def test_handlers_that_can_be_checked_fail_the_dag_at_parse_time() -> None:
    """A key that looks like a pattern, or a callable that cannot take the envelope, fails where the DAG is
    defined; a dotted path is imported (and checked) when the task runs."""
    with pytest.raises(ValueError, match=r"handler key 'urn:babel:orders:\*' looks like a pattern"):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={"urn:babel:orders:*": "x.y"})
    with pytest.raises(ValueError, match=r"handler for 'urn:x' \(with_context\(envelope.*'None'\) cannot be called"):
        BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={"urn:x": handlers.with_context})
    BabelQueueConsumeOperator(task_id="c", queue_name="q", handlers={"urn:x": "tests.operators.handlers.with_context"})
