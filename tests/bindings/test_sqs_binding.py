"""SQS binding specifics, live against moto's HTTP server (real boto3, real HTTP; never AWS).

The shared behaviour is in test_contract.py. Here: the conformance block ``sqs`` (pure functions, and the
projection as received from the server), FIFO group/deduplication rules, delays, native batches and size
limits, dead-letter queue resolution, base64 carriage of non-text bodies, and the hook.

Calls are observed with botocore's ``provide-client-params`` event on an injected client: the requests
still go to the server unchanged (one test edits one batch entry there, to make SQS itself refuse it).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_babelqueue import envelope as bq
from airflow_provider_babelqueue.bindings.base import BindingError, NotSupportedError, PublishBatchError
from airflow_provider_babelqueue.bindings.sqs import (
    BODY_ENCODING_ATTRIBUTE,
    SqsBinding,
    SqsConfig,
    dead_letter_queue_name,
    message_attributes,
    reconcile_attempts,
)
from airflow_provider_babelqueue.bindings.sqs.wire import dead_letter_source_names
from airflow_provider_babelqueue.hooks.base import ConnectionConfigError
from airflow_provider_babelqueue.hooks.sqs import BabelQueueSqsHook
from tests.bindings.conftest import kept
from tests.bindings.sqs_server import (
    REGION,
    free_port,
    queue_urls,
    sqs_client,
)
from tests.conftest import compact, conformance_manifest, fixture_dict

SQS_BLOCK = conformance_manifest()["sqs"]
POISON = b'\xff\xfe{"job": not json'
SECRET = "Hunter2-secret/key"

Factory = Callable[..., SqsBinding]


@pytest.fixture
def make(endpoint: str, admin: Any) -> Iterator[Factory]:
    made: list[SqsBinding] = []

    def factory(client: Any = None, **options: Any) -> SqsBinding:
        config = SqsConfig(
            region_name=REGION,
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            **({"create_queues": True} | options),  # tests publish to fresh queues; off is tested on its own
        )
        made.append(SqsBinding(config, client=client))
        return made[-1]

    yield factory
    for binding in made:
        binding.close()


@pytest.fixture
def q() -> str:
    return f"bq-{uuid.uuid4().hex[:10]}"


class Recorder:
    """A real client whose outgoing API parameters are recorded (botocore event; nothing is replaced)."""

    def __init__(self, endpoint: str) -> None:
        self.client = sqs_client(endpoint)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.client.meta.events.register("provide-client-params.sqs", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((model.name, copy.deepcopy(params)))

    def of(self, operation: str) -> list[dict[str, Any]]:
        return [params for name, params in self.calls if name == operation]


@pytest.fixture
def recorder(endpoint: str) -> Recorder:
    return Recorder(endpoint)


def body_for(queue: str, n: int = 0, **data: Any) -> bytes:
    return bq.encode(bq.make_envelope("urn:babel:orders:created", {"n": n, **data}, queue_name=queue))


def raw_receive(admin: Any, queue: str) -> dict[str, Any]:
    """One message as the server holds it, with every system and message attribute."""
    url = admin.get_queue_url(QueueName=queue)["QueueUrl"]
    reply = admin.receive_message(
        QueueUrl=url, AttributeNames=["All"], MessageAttributeNames=["All"], WaitTimeSeconds=1
    )
    [message] = reply["Messages"]
    return message


def plain(attributes: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {k: {"DataType": v["DataType"], "StringValue": v["StringValue"]} for k, v in attributes.items()}


# ------------------------------------------------------------------------------ conformance block "sqs"


def test_attribute_projection_matches_the_conformance_block() -> None:
    block = SQS_BLOCK["attribute_projection"]
    assert message_attributes(fixture_dict(block["envelope_file"])) == block["message_attributes"]


@pytest.mark.parametrize("case", SQS_BLOCK["attempts_reconciliation"]["cases"], ids=lambda c: c["name"])
def test_attempts_reconciliation_matches_the_conformance_block(case: dict[str, Any]) -> None:
    assert reconcile_attempts(case["body_attempts"], case["approximate_receive_count"]) == case["expected_attempts"]


def test_projection_as_received_from_the_server(make: Factory, admin: Any, q: str) -> None:
    block = SQS_BLOCK["attribute_projection"]
    body = compact(fixture_dict(block["envelope_file"]))
    make().publish(body, q)
    message = raw_receive(admin, q)
    assert message["Body"].encode() == body
    assert plain(message["MessageAttributes"]) == block["message_attributes"]  # exactly the six, typed


def test_projection_leaves_out_what_sqs_would_refuse() -> None:
    env = bq.make_envelope("urn:x", {})
    env["trace_id"], env["meta"]["created_at"] = "", "yesterday"
    assert set(message_attributes(env)) == {"bq-job", "bq-message-id", "bq-schema-version", "bq-source-lang"}
    assert message_attributes({"urn": "urn:alias"}) == {"bq-job": {"DataType": "String", "StringValue": "urn:alias"}}


def test_received_attempts_and_delivery_count_are_reconciled(make: Factory, admin: Any, q: str) -> None:
    binding = make(visibility_timeout=0)  # every receive makes it visible again at once: a native redelivery
    binding.publish(body_for(q), q)
    first = binding.reserve(q, timeout=1)
    second = binding.reserve(q, timeout=1)
    third = binding.reserve(q, timeout=1)
    assert [m.delivery_count for m in (first, second, third)] == [1, 2, 3]
    assert [m.attempts for m in (first, second, third)] == [0, 1, 2]
    assert third.envelope["attempts"] == 0 and third.body == first.body  # the body is never rewritten on read
    binding.ack(third)


# ------------------------------------------------------------------------------------------------- FIFO


def test_fifo_group_is_the_queue_name_and_dedup_id_is_meta_id(make: Factory, admin: Any, q: str) -> None:
    fifo = f"{q}.fifo"
    body = body_for(fifo)
    binding = make()
    binding.publish(body, fifo)
    binding.publish(body, fifo)  # the same meta.id within 5 minutes: SQS keeps one
    message = raw_receive(admin, fifo)
    assert message["Attributes"]["MessageGroupId"] == fifo
    assert message["Attributes"]["MessageDeduplicationId"] == bq.decode(body)["meta"]["id"]
    assert binding.depth(fifo) == 0  # the duplicate was dropped (the one copy is in flight)


def test_fifo_group_can_be_configured(make: Factory, admin: Any, q: str) -> None:
    make(fifo_group_id="tenant-42").publish(body_for(q), f"{q}.fifo")
    assert raw_receive(admin, f"{q}.fifo")["Attributes"]["MessageGroupId"] == "tenant-42"


def test_fifo_release_is_not_swallowed_by_deduplication(make: Factory, q: str) -> None:
    fifo, binding = f"{q}.fifo", make()
    body = body_for(fifo)
    binding.publish(body, fifo)
    first = binding.reserve(fifo, timeout=1)
    binding.release(first)  # same meta.id, seconds later: only a fresh deduplication id gets it through
    second = binding.reserve(fifo, timeout=1)
    assert second is not None and second.meta_id == first.meta_id and second.attempts == 1
    binding.dead_letter(second, bq.Reason.FAILED)  # the FIFO DLQ: "<queue>-failed.fifo"
    assert binding.dead_letter_name(fifo) == f"{q}-failed.fifo"
    dead = binding.reserve_dead_letter(fifo, timeout=1)
    assert dead.envelope["dead_letter"]["attempts"] == 1 and dead.meta_id == first.meta_id
    binding.ack(dead)


def test_fifo_delays_are_refused_on_publish_and_native_on_release(make: Factory, q: str) -> None:
    fifo, binding = f"{q}.fifo", make()
    with pytest.raises(BindingError, match="no per-message delay"):
        binding.publish(body_for(fifo), fifo, delay=5)
    binding.publish(body_for(fifo), fifo)
    first = binding.reserve(fifo, timeout=1)
    binding.release(first, delay=1)  # ChangeMessageVisibility: the same message comes back
    assert binding.reserve(fifo, timeout=0) is None
    again = binding.reserve(fifo, timeout=3)
    assert again.body == first.body and again.delivery_count == 2 and again.attempts == 1
    binding.ack(again)


def test_content_based_dedup_sends_no_dedup_id(make: Factory, admin: Any, recorder: Recorder, q: str) -> None:
    fifo = f"{q}.fifo"
    binding = make(client=recorder.client, content_based_dedup=True)
    binding.publish(body_for(fifo), fifo)
    url = admin.get_queue_url(QueueName=fifo)["QueueUrl"]
    attributes = admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["FifoQueue"] == "true" and attributes["ContentBasedDeduplication"] == "true"
    [sent] = recorder.of("SendMessage")
    assert "MessageDeduplicationId" not in sent and sent["MessageGroupId"] == fifo
    message = raw_receive(admin, fifo)
    assert message["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(message["Body"].encode()).hexdigest()


# ------------------------------------------------------------------------------- delays, batches, sizes


def test_delay_is_rounded_up_and_capped_at_900_with_a_warning(
    make: Factory, admin: Any, recorder: Recorder, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    binding = make(client=recorder.client)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_babelqueue.bindings.sqs"):
        binding.publish(body_for(q), q, delay=0.2)
        assert not caplog.records
        binding.publish(body_for(q), q, delay=3600)
    assert [p["DelaySeconds"] for p in recorder.of("SendMessage")] == [1, 900]
    assert "capped to 900" in caplog.text
    url = admin.get_queue_url(QueueName=q)["QueueUrl"]
    counts = admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessagesDelayed"] == "2" and binding.depth(q) == 0
    assert make(include_in_flight_in_depth=True).depth(q) == 2


def test_batch_of_25_is_three_native_batches_in_order(make: Factory, recorder: Recorder, q: str) -> None:
    binding = make(client=recorder.client)
    bodies = [body_for(q, i) for i in range(25)]
    binding.publish_batch(bodies, q)
    batches = recorder.of("SendMessageBatch")
    assert [len(b["Entries"]) for b in batches] == [10, 10, 5]
    assert [e["MessageBody"].encode() for b in batches for e in b["Entries"]] == bodies
    assert all(len(e["MessageAttributes"]) == 6 for b in batches for e in b["Entries"])
    assert binding.depth(q) == 25


def test_batches_respect_the_byte_budget(make: Factory, recorder: Recorder, q: str) -> None:
    binding = make(client=recorder.client, max_message_bytes=262_144)  # a queue kept at the 256 KiB default
    bodies = [body_for(q, i, pad="x" * 60_000) for i in range(10)]  # ~60 KB each: 4 fit in 256 KiB
    binding.publish_batch(bodies, q)
    batches = recorder.of("SendMessageBatch")
    assert [len(b["Entries"]) for b in batches] == [4, 4, 2]
    for batch in batches:
        size = sum(
            len(e["MessageBody"].encode())
            + sum(len(f"{k}{a['DataType']}{a['StringValue']}".encode()) for k, a in e["MessageAttributes"].items())
            for e in batch["Entries"]
        )
        assert size <= 262_144
    received = []
    while (message := binding.reserve(q)) is not None:
        received.append(message.body)
        binding.ack(message)
    assert sorted(received) == sorted(bodies)


def test_oversize_messages_are_refused_before_sending(make: Factory, recorder: Recorder, q: str) -> None:
    binding = make(client=recorder.client, max_message_bytes=262_144)
    huge = body_for(q, pad="x" * 262_144)
    with pytest.raises(BindingError, match=r"max_message_bytes=262144; nothing was sent"):
        binding.publish(huge, q)
    with pytest.raises(PublishBatchError, match="max_message_bytes=262144") as caught:
        binding.publish_batch([body_for(q), huge, body_for(q)], q)
    assert caught.value.failed == [0, 1, 2]
    assert recorder.of("SendMessage") == [] and recorder.of("SendMessageBatch") == []
    assert binding.depth(q) == 0
    roomy = make()  # the default limit is the service maximum (1 MiB since 2025)
    roomy.publish(huge, f"{q}-big")
    assert roomy.reserve(f"{q}-big").body == huge


def test_the_default_limit_is_the_service_maximum(make: Factory, recorder: Recorder, q: str) -> None:
    binding = make(client=recorder.client)
    assert binding.config.max_message_bytes == 1_048_576
    with pytest.raises(BindingError, match=r"max_message_bytes=1048576; nothing was sent"):
        binding.publish(body_for(q, pad="x" * 1_048_576), q)
    assert recorder.of("SendMessage") == []


def test_batch_failures_name_exactly_the_refused_entries(make: Factory, recorder: Recorder, q: str) -> None:
    def refuse_entry_3(params: dict[str, Any], **_: Any) -> None:
        for entry in params["Entries"]:
            if entry["Id"] == "3":
                entry["DelaySeconds"] = 901  # SQS refuses this entry alone, in its Failed list

    binding = make(client=recorder.client)
    recorder.client.meta.events.register("before-parameter-build.sqs.SendMessageBatch", refuse_entry_3)
    bodies = [body_for(q, i) for i in range(12)]
    with pytest.raises(PublishBatchError) as caught:
        binding.publish_batch(bodies, q)
    assert caught.value.failed == [3]
    assert binding.depth(q) == 11


def test_a_failing_batch_call_reports_it_and_everything_after(
    make: Factory, admin: Any, recorder: Recorder, q: str
) -> None:
    binding = make(client=recorder.client)
    binding.publish(body_for(q), q)  # the URL is cached now
    recorder.client.meta.events.register(
        "after-call.sqs.SendMessageBatch",
        lambda **_: admin.delete_queue(QueueUrl=admin.get_queue_url(QueueName=q)["QueueUrl"]),
    )
    with pytest.raises(PublishBatchError, match="10 of 25 bodies were delivered") as caught:
        binding.publish_batch([body_for(q, i) for i in range(25)], q)
    assert caught.value.failed == list(range(10, 25))


# ---------------------------------------------------------------------------------------- dead letters


def test_dlq_names_keep_the_fifo_rule() -> None:
    assert dead_letter_queue_name("orders") == "orders-failed"
    assert dead_letter_queue_name("orders.fifo") == "orders-failed.fifo"
    assert dead_letter_queue_name("orders.fifo", "-dlq") == "orders-dlq.fifo"
    with pytest.raises(ValueError, match="dead_letter_suffix"):
        SqsConfig(dead_letter_suffix=".failed")  # '.' is illegal in SQS names


def test_queue_names_sqs_cannot_hold_are_refused_clearly(make: Factory) -> None:
    with pytest.raises(BindingError, match=r"'orders\.failed' is not a valid SQS queue name.*'\.' is illegal"):
        make().publish(body_for("x"), "orders.failed")


def test_the_redrive_policy_target_is_the_dlq(make: Factory, admin: Any, q: str) -> None:
    target = admin.create_queue(QueueName=f"{q}-native-dlq")["QueueUrl"]
    arn = admin.get_queue_attributes(QueueUrl=target, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 5})
    admin.create_queue(QueueName=q, Attributes={"RedrivePolicy": policy})
    binding = make()
    binding.publish(body_for(q), q)
    binding.dead_letter(binding.reserve(q), "unknown_urn")
    assert binding.dead_letter_name(q) == f"{q}-native-dlq" and binding.dead_letter_depth(q) == 1
    assert json.loads(raw_receive(admin, f"{q}-native-dlq")["Body"])["dead_letter"]["reason"] == "unknown_urn"
    assert not any(url.endswith(f"/{q}-failed") for url in queue_urls(admin))  # no fallback DLQ was made


def test_fallback_dlq_is_created_for_triage(make: Factory, admin: Any, q: str) -> None:
    binding = make(dead_letter_suffix="-dlq")
    binding.publish(body_for(q), q)
    binding.dead_letter(binding.reserve(q), "failed", error="boom")
    url = admin.get_queue_url(QueueName=f"{q}-dlq")["QueueUrl"]
    attributes = admin.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["MessageRetentionPeriod"] == "1209600" and attributes["MaximumMessageSize"] == "1048576"
    with pytest.raises(NotSupportedError):
        binding.browse_dead_letters(q)
    dead = binding.reserve_dead_letter(q, timeout=1)
    binding.release(dead)  # back on the DLQ exactly as it was
    again = binding.reserve_dead_letter(q, timeout=1)
    assert again.body == dead.body and again.from_dead_letter
    binding.ack(again)
    assert binding.dead_letter_depth(q) == 0


def test_dlq_source_names_keep_the_fifo_rule() -> None:
    entries = ("-failed", "-dlq", "dead-{queue}", "shared-dead-letters")
    assert dead_letter_source_names("orders", entries) == [
        "orders-failed", "orders-dlq", "dead-orders", "shared-dead-letters"]
    assert dead_letter_source_names("orders.fifo", entries) == [
        "orders-failed.fifo", "orders-dlq.fifo", "dead-orders.fifo", "shared-dead-letters.fifo"]
    assert SqsConfig().dead_letter_sources == ("-failed", "-dlq")
    assert SqsConfig(dead_letter_sources=" -dlq , dead-{queue},-dlq").dead_letter_sources == ("-dlq", "dead-{queue}")
    assert SqsConfig(dead_letter_sources="none").dead_letter_sources == ()
    with pytest.raises(ValueError, match=r"dead_letter_sources entry '\.dlq'"):
        SqsConfig(dead_letter_sources=".dlq")  # '.' is illegal in SQS names


def test_every_read_takes_every_source_in_order(make: Factory, admin: Any, q: str) -> None:
    target = admin.create_queue(QueueName=f"{q}-native")["QueueUrl"]
    arn = admin.get_queue_attributes(QueueUrl=target, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    admin.create_queue(QueueName=q, Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn,
                                                                             "maxReceiveCount": 5})})
    sources = [f"{q}-native", f"{q}-failed", f"{q}-dlq"]
    for n, name in enumerate(sources):  # 1 + 2 + 3 dead letters, -failed and -dlq made by someone else
        url = target if n == 0 else admin.create_queue(QueueName=name)["QueueUrl"]
        for i in range(n + 1):
            admin.send_message(QueueUrl=url, MessageBody=body_for(q, 10 * n + i).decode())
    binding = make()
    assert binding.dead_letter_sources(q) == sources and binding.dead_letter_name(q) == f"{q}-native"
    assert binding.dead_letter_depth(q) == 6
    taken = binding.reserve_dead_letters(q, 100)
    assert [m.dead_letter_source for m in taken] == [sources[0]] + [sources[1]] * 2 + [sources[2]] * 3
    assert all(m.from_dead_letter and m.queue_name == q for m in taken)
    binding.release(taken[-1])  # back to the queue it came from, unchanged
    binding.ack_many(taken[:-1])
    assert binding.dead_letter_depth(q) == 1
    again = binding.reserve_dead_letter(q, timeout=1)
    assert again.dead_letter_source == f"{q}-dlq" and again.body == taken[-1].body
    binding.ack(again)
    assert binding.dead_letter_depth(q) == 0 and binding.reserve_dead_letter(q) is None


def test_reads_never_create_a_queue(make: Factory, admin: Any, q: str) -> None:
    binding, before = make(), queue_urls(admin)  # create_queues is on
    assert binding.dead_letter_depth(q) == 0 and binding.reserve_dead_letter(q, timeout=0) is None
    assert binding.reserve_dead_letters(f"{q}.fifo", 10) == [] and binding.dead_letter_depth(f"{q}.fifo") == 0
    assert binding.dead_letter_name(q) == f"{q}-failed"
    assert binding.dead_letter_sources(f"{q}.fifo") == [f"{q}-failed.fifo", f"{q}-dlq.fifo"]
    assert queue_urls(admin) == before  # neither the DLQs nor the queue itself
    admin.create_queue(QueueName=f"{q}-dlq")  # appears later: found once the 30 s miss memory is forgotten
    binding._missing.clear()
    assert binding.dead_letter_depth(q) == 0 and binding.dead_letter_sources(q) == [f"{q}-failed", f"{q}-dlq"]
    assert not any(url.endswith(f"/{q}-failed") or url.endswith(f"/{q}") for url in queue_urls(admin))


def test_only_the_written_dlq_is_read_when_configured_so(make: Factory, admin: Any, q: str) -> None:
    url = admin.create_queue(QueueName=f"{q}-dlq")["QueueUrl"]
    admin.send_message(QueueUrl=url, MessageBody=body_for(q).decode())
    binding = make(dead_letter_sources="none")
    assert binding.dead_letter_sources(q) == [f"{q}-failed"] and binding.dead_letter_depth(q) == 0
    sdk_side = make(dead_letter_suffix="-dlq", dead_letter_sources=())
    assert sdk_side.dead_letter_sources(q) == [f"{q}-dlq"] and sdk_side.dead_letter_depth(q) == 1


def test_fifo_dead_letters_are_received_ten_at_a_time(make: Factory, admin: Any, recorder: Recorder, q: str) -> None:
    fifo = f"{q}.fifo"
    url = admin.create_queue(QueueName=f"{q}-dlq.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    bodies = [body_for(fifo, n) for n in range(12)]
    for body in bodies:  # one message group, as both SDKs write their dead letters
        admin.send_message(QueueUrl=url, MessageBody=body.decode(), MessageGroupId="dlq",
                           MessageDeduplicationId=bq.decode(body)["meta"]["id"])
    binding = make(client=recorder.client)
    assert binding.dead_letters_hidden_while_held(fifo) and not binding.dead_letters_hidden_while_held(q)
    first = binding.reserve_dead_letters(fifo, 100)
    assert [m.body for m in first] == bodies[:10]  # one receive; the group's rest is hidden while these are held
    assert binding.reserve_dead_letters(fifo, 100) == []
    binding.ack_many(first)  # settled: the group goes on
    rest = binding.reserve_dead_letters(fifo, 100)
    assert [m.body for m in rest] == bodies[10:]
    binding.ack_many(rest)
    assert {p["MaxNumberOfMessages"] for p in recorder.of("ReceiveMessage")} == {10}
    assert [len(p["Entries"]) for p in recorder.of("DeleteMessageBatch")] == [10, 2]


def test_a_redriven_fifo_message_gets_a_fresh_deduplication_id(
    make: Factory, admin: Any, recorder: Recorder, q: str
) -> None:
    """SQS drops a FIFO send whose deduplication id it saw within 5 minutes, even when that message was deleted
    since; moto only compares with messages still queued, so the id sent is what is checked here."""
    fifo = f"{q}.fifo"
    binding = make(client=recorder.client)
    binding.publish(body_for(fifo), fifo)
    binding.dead_letter(binding.reserve(fifo, timeout=1), "failed")
    dead = binding.reserve_dead_letter(fifo, timeout=1)
    fresh = body_for(fifo, 1)
    redriven = bq.encode(bq.reset_for_replay(bq.decode(dead.body)))
    binding.publish_batch([fresh, redriven], fifo)
    [batch] = recorder.of("SendMessageBatch")
    assert batch["Entries"][0]["MessageDeduplicationId"] == bq.decode(fresh)["meta"]["id"]
    assert batch["Entries"][1]["MessageDeduplicationId"] not in ("", dead.meta_id)
    binding.ack(dead)


def test_missing_queues_are_an_error_when_creation_is_off(make: Factory, admin: Any, q: str) -> None:
    with pytest.raises(BindingError, match=rf"'{q}'.*does not exist; create it, or enable create_queues"):
        make(create_queues=False).reserve(q)
    assert not any(url.endswith(f"/{q}") for url in queue_urls(admin))


# ----------------------------------------------------------------------------- bodies, headers, secrets


@pytest.mark.parametrize("body", [POISON, '{"job":"urn:x","note":"\uffff"}'.encode()], ids=["bytes", "U+FFFF"])
def test_bodies_sqs_cannot_carry_as_text_survive_byte_exact(make: Factory, admin: Any, q: str, body: bytes) -> None:
    binding = make()
    binding.publish(body, q)
    stored = raw_receive(admin, q)
    assert base64.b64decode(stored["Body"]) == body
    assert stored["MessageAttributes"][BODY_ENCODING_ATTRIBUTE]["StringValue"] == "base64"
    admin.change_message_visibility(
        QueueUrl=admin.get_queue_url(QueueName=q)["QueueUrl"],
        ReceiptHandle=stored["ReceiptHandle"],
        VisibilityTimeout=0,
    )
    message = binding.reserve(q, timeout=1)
    assert message.body == body and BODY_ENCODING_ATTRIBUTE not in message.headers
    binding.dead_letter(message, "poison")
    dead = binding.reserve_dead_letter(q, timeout=1)
    if message.envelope is None:
        assert kept(dead) == body  # poison is dead-lettered byte for byte, in a poison wrapper
    else:
        assert dead.envelope["note"] == "\uffff" and dead.envelope["dead_letter"]["reason"] == "poison"


def test_headers_travel_as_attributes_and_survive_a_release(make: Factory, q: str) -> None:
    binding = make()
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    binding.publish(body_for(q), q, headers={"traceparent": traceparent, "bq-job": "ignored: the projection wins"})
    first = binding.reserve(q)
    assert first.headers["traceparent"] == traceparent and first.headers["bq-job"] == "urn:babel:orders:created"
    binding.release(first)
    assert binding.reserve(q, timeout=1).headers["traceparent"] == traceparent
    with pytest.raises(BindingError, match="cannot be an SQS message attribute name"):
        binding.publish(body_for(q), q, headers={"AWS.reserved": "x"})


def test_secrets_stay_out_of_repr_and_errors() -> None:
    config = SqsConfig(
        region_name=REGION,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        aws_access_key_id="AKID",
        aws_secret_access_key=SECRET,
        aws_session_token=SECRET + "-token",
    )
    assert SECRET not in repr(config) and "AKID" in repr(config)
    with pytest.raises(BindingError) as caught:
        SqsBinding(config).depth("orders")
    assert "cannot reach the endpoint" in str(caught.value) and SECRET not in str(caught.value)


def test_an_assumed_role_is_used(make: Factory, endpoint: str, q: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", endpoint)  # moto answers STS on the same port
    binding = make(role_arn="arn:aws:iam::123456789012:role/babelqueue-writer")
    signed: list[dict[str, str]] = []
    binding.client.meta.events.register("before-send.sqs", lambda request, **_: signed.append(dict(request.headers)))
    binding.publish(body_for(q), q)
    binding.ack(binding.reserve(q))
    access_keys = {h["Authorization"].decode().split("Credential=")[1].split("/")[0] for h in signed}
    assert len(access_keys) == 1 and access_keys != {"testing"}  # the role's temporary key, not the source key
    assert all("X-Amz-Security-Token" in h for h in signed)


# ------------------------------------------------------------------------------------------------- hook


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, spec: dict[str, Any]) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(spec))
    return conn_id


def test_hook_builds_the_binding_from_allowlisted_extras(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, admin: Any, q: str
) -> None:
    extra = {
        "region_name": REGION,
        "endpoint_url": endpoint,
        "dead_letter_suffix": "-dlq",
        "dead_letter_sources": "-failed, legacy-{queue}",
        "create_queues": "true",
        "max_message_bytes": "524288",
        "visibility_timeout": "45",
        "aws_session_token": SECRET,
        "queue_url_prefix": "not read",
    }
    conn_id = define(
        monkeypatch, "bq_sqs", {"conn_type": "babelqueue+sqs", "login": "testing", "password": SECRET, "extra": extra}
    )
    hook = BabelQueueSqsHook(conn_id)
    config = hook.get_binding().config
    assert (config.region_name, config.dead_letter_suffix, config.max_message_bytes) == (REGION, "-dlq", 524288)
    assert config.visibility_timeout == 45.0 and config.aws_secret_access_key == SECRET
    assert config.dead_letter_sources == ("-failed", "legacy-{queue}")
    binding = hook.get_binding()
    binding.publish(body_for(q), q)
    binding.dead_letter(binding.reserve(q), "failed")
    assert binding.dead_letter_depth(q) == 1 and any(u.endswith(f"/{q}-dlq") for u in queue_urls(admin))
    assert hook.test_connection() == (True, f"Connected to BabelQueue Amazon SQS at {endpoint} (region {REGION})")
    hook.close()


def test_queues_are_not_created_by_default(monkeypatch: pytest.MonkeyPatch, endpoint: str, admin: Any, q: str) -> None:
    """Off by default, in the binding config, in the connection (no ``create_queues`` extra) and in the form: a
    publish to a queue that does not exist is an error naming it, and creates nothing (a typo must not make a
    queue nobody reads); ``create_queues`` turned on creates it."""
    from airflow_provider_babelqueue.hooks.connection_specs import SQS

    assert SqsConfig().create_queues is False
    assert next(e for e in SQS.extras if e.name == "create_queues").conn_field()["schema"]["default"] is False
    spec = {"conn_type": "babelqueue+sqs", "login": "testing", "password": "testing",
            "extra": {"region_name": REGION, "endpoint_url": endpoint}}
    hook = BabelQueueSqsHook(define(monkeypatch, "bq_sqs_default", spec))
    with pytest.raises(BindingError, match=rf"'{q}'.*does not exist; create it, or enable create_queues"):
        hook.get_binding().publish(body_for(q), q)
    hook.close()
    assert not any(url.endswith(f"/{q}") for url in queue_urls(admin))
    spec["extra"] |= {"create_queues": "true"}
    hook = BabelQueueSqsHook(define(monkeypatch, "bq_sqs_create", spec))
    hook.get_binding().publish(body_for(q), q)
    hook.close()
    assert any(url.endswith(f"/{q}") for url in queue_urls(admin))


def test_hook_test_connection_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    conn_id = define(
        monkeypatch,
        "bq_sqs_closed",
        {
            "conn_type": "babelqueue+sqs",
            "login": "AKID",
            "password": SECRET,
            "extra": {"region_name": REGION, "endpoint_url": closed},
        },
    )
    ok, message = BabelQueueSqsHook(conn_id).test_connection()
    assert ok is False and closed in message and "cannot reach the endpoint" in message and SECRET not in message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"login": "AKID"}, "login .* and password .* go together"),
        ({"extra": {"create_queues": "maybe"}}, "'create_queues' must be true or false"),
        ({"extra": {"max_message_bytes": "1.5"}}, "'max_message_bytes' must be a whole number"),
        ({"extra": {"max_message_bytes": "100"}}, "max_message_bytes must be 1024-1048576"),
        ({"extra": {"wait_time_seconds": "30"}}, "wait_time_seconds must be 1-20"),
    ],
)
def test_hook_bad_fields_name_the_field(monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any], message: str) -> None:
    hook = BabelQueueSqsHook(define(monkeypatch, "bq_sqs_bad", {"conn_type": "babelqueue+sqs", **spec}))
    with pytest.raises(ConnectionConfigError, match=message):
        hook.get_binding()


# ---------------------------------------------------------------------------------------- batched consumption


def test_a_consumer_batch_is_received_ten_at_a_time_and_deleted_ten_at_a_time(make: Factory, q: str,
                                                                             recorder: Recorder) -> None:
    """A batch of 25 is three ReceiveMessage calls asking for 10, 10 and 5, and its settlement three
    DeleteMessageBatch calls of 10, 10 and 5 entries: never one call per message."""
    from airflow_provider_babelqueue.engine.consume import Consumer

    binding = make(client=recorder.client)
    binding.publish_batch([body_for(q, n) for n in range(25)], q)
    recorder.calls.clear()
    seen: list[int] = []
    summary = Consumer(binding, q, {"urn:babel:orders:created": lambda env: seen.append(env["data"]["n"])},
                       batch_size=25).run(reserve_timeout=0)
    assert summary.handled == 25 and sorted(seen) == list(range(25))
    asked = [params["MaxNumberOfMessages"] for params in recorder.of("ReceiveMessage")]
    assert asked[:3] == [10, 10, 5], asked
    assert [len(params["Entries"]) for params in recorder.of("DeleteMessageBatch")] == [10, 10, 5]
    assert recorder.of("DeleteMessage") == []
    assert binding.depth(q) == 0
