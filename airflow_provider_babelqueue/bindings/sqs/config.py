"""The SQS binding's configuration: where SQS is, who we are, and how queues behave.

Checked when built (SQS's own limits on names, long polls, visibility and sizes), so a wrong connection extra
fails where it is configured, not at the first call to AWS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base import Binding
from ..redaction import config_repr
from .wire import DEDUP_ID, MAX_VISIBILITY_TIMEOUT, NAME, SERVICE_MAX_MESSAGE_BYTES

__all__ = ["DEFAULT_DEAD_LETTER_SOURCES", "SqsConfig"]


#: The DLQs read besides the written one: ours, and ``-dlq`` where the official SDKs' workers write
#: (``SqsTransport.dead_letter_queue_name``), so a mixed fleet's dead letters are counted and drained together.
DEFAULT_DEAD_LETTER_SOURCES = ("-failed", "-dlq")


@dataclass(frozen=True, slots=True)
class SqsConfig:
    """Where SQS is, who we are, and how queues behave.

    :param region_name: ``None`` = the default chain (``AWS_DEFAULT_REGION``, profile).
    :param endpoint_url: another endpoint (VPC endpoint, LocalStack, moto); ``None`` for AWS's own.
    :param aws_access_key_id: with ``aws_secret_access_key`` (kept out of ``repr`` and errors, like
        ``aws_session_token``); neither = the default credential chain, the better choice in production.
    :param role_arn: assume this role through STS (``AWS_ENDPOINT_URL_STS`` points elsewhere); botocore
        refreshes the credentials before they expire, so long-lived workers keep working.
    :param fifo_group_id: ``MessageGroupId`` on FIFO queues; ``None`` = the queue name (one ordered group).
    :param content_based_dedup: send no ``MessageDeduplicationId`` (the FIFO queue hashes the body; queues we
        create get the attribute). Sending meta.id works on either kind of queue.
    :param dead_letter_suffix: fallback DLQ = ``<queue><suffix>`` for queues without a ``RedrivePolicy``: where
        dead letters are written.
    :param dead_letter_sources: the DLQs *read* besides the ``RedrivePolicy`` target and the written one
        (both always read, first): suffixes, ``{queue}`` templates or full names, as a list or comma text
        (:func:`dead_letter_source_names`). The default adds ``-dlq``, where the official SDKs' workers write,
        so their dead letters are counted, drained and redriven without configuration; ``()`` reads only the
        written one. A read never creates a queue: a missing one counts as empty.
    :param wait_time_seconds: longest single long poll (1-20); ``reserve`` loops for longer timeouts.
    :param visibility_timeout: whole seconds a received message stays hidden (sent with every receive, set
        on queues we create); ``None`` keeps the queue's own (30 s unless changed).
    :param max_message_bytes: checked before sending (body + attributes, as SQS counts); also the
        ``MaximumMessageSize`` of queues we create and the byte budget of one native batch.
    :param include_in_flight_in_depth: ``depth`` also counts in-flight and delayed messages.
    :param create_queues: create missing queues on first use. Off by default: a missing queue is an error naming
        it, so a mistyped queue name never creates a queue nobody reads (nor one without the RedrivePolicy, KMS
        key or tags that infrastructure code gives real queues).
    """

    region_name: str | None = None
    endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    role_arn: str | None = None
    fifo_group_id: str | None = None
    content_based_dedup: bool = False
    dead_letter_suffix: str = "-failed"
    dead_letter_sources: tuple[str, ...] | str | None = DEFAULT_DEAD_LETTER_SOURCES
    wait_time_seconds: int = 20
    visibility_timeout: float | None = None
    max_message_bytes: int = SERVICE_MAX_MESSAGE_BYTES
    include_in_flight_in_depth: bool = False
    create_queues: bool = False

    #: ``endpoint_url`` may carry a password or a token (userinfo, query): the repr redacts it.
    __repr__ = config_repr

    def __post_init__(self) -> None:
        sources = Binding.source_entries(self.dead_letter_sources)
        object.__setattr__(self, "dead_letter_sources", sources)
        bad_source = next(
            (s for s in sources if not NAME.fullmatch(s.replace("{queue}", "q").removesuffix(".fifo"))), None
        )
        for bad, problem in (
            (
                bad_source is not None,
                f"dead_letter_sources entry {bad_source!r} must be a suffix, a full name or a {{queue}} template "
                "of letters, digits, '-' or '_' (SQS names allow nothing else)",
            ),
            (
                bool(self.aws_access_key_id) != bool(self.aws_secret_access_key),
                "aws_access_key_id and aws_secret_access_key go together (neither = the default chain)",
            ),
            (not NAME.fullmatch(self.dead_letter_suffix or ""), "dead_letter_suffix must be letters, digits, - or _"),
            (not 1 <= self.wait_time_seconds <= 20, "wait_time_seconds must be 1-20 (SQS's long-poll cap)"),
            (not 0 <= (self.visibility_timeout or 0) <= MAX_VISIBILITY_TIMEOUT, "visibility_timeout must be 0-43200"),
            (not 1024 <= self.max_message_bytes <= SERVICE_MAX_MESSAGE_BYTES, "max_message_bytes must be 1024-1048576"),
            (not DEDUP_ID.fullmatch(self.fifo_group_id or "-"), "fifo_group_id must be 1-128 printable ASCII"),
        ):
            if bad:
                raise ValueError(problem)
