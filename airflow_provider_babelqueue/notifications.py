"""Notifications: a dead-letter summary posted to a webhook (Slack, Microsoft Teams, or any JSON endpoint).

:class:`BabelQueueDeadLetterNotifier` is an Airflow notifier: pass it as a task's or a DAG's
``on_failure_callback`` / ``on_success_callback`` (or call it with a context). It reads the dead-letter queues of
one BabelQueue connection without removing anything (:func:`~.engine.fingerprints.dead_letter_summary`: the depth
of each, and where the broker can browse its DLQ the counts by reason and by source and the top error
fingerprints, the Spark triage's, with a sample error) and posts one JSON document: a ``text`` field that Slack's
and Teams' incoming webhooks show as the message, and the same summary as structured fields under ``babelqueue``
for any other receiver.

The webhook is an Airflow connection of type ``http``: its host is the whole URL (``https://hooks.slack.com/
services/…``), or a host name with the scheme in ``schema`` and a ``port``; its password, when set, is sent as a
bearer token. Only the standard library talks HTTP (``urllib``). The URL's path and query (a Slack webhook's
secret) and the token are registered with Airflow's log masker and never written to a message or a log: errors
name the scheme and host only.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from airflow.sdk import BaseHook
from airflow.sdk.bases.notifier import BaseNotifier

from .bindings.redaction import scrub
from .core.errors import BabelQueueError, ConnectionConfigError
from .engine.fingerprints import dead_letter_summary
from .hooks import DEFAULT_CONN_ID, get_hook
from .operators._params import is_unset, parse_list

__all__ = ["BabelQueueDeadLetterNotifier", "WebhookError", "summary_text", "webhook_payload"]

#: Connection types accepted for the webhook (a URI ``https://…`` gives ``https``).
WEBHOOK_CONN_TYPES = ("http", "https")
#: Characters of a receiver's error response quoted in :class:`WebhookError` (after the secrets are removed).
_RESPONSE_CHARS = 300


class WebhookError(BabelQueueError):
    """The webhook could not be reached or refused the notification. The message names the scheme and host
    only, never the URL's path or the token."""


def summary_text(summary: Mapping[str, Any], title: str) -> str:
    """The human-readable message: the title, then per queue its depth, its reasons and its top fingerprints
    (count, exception type, error pattern, a sample error). Plain text with ``•`` bullets, which Slack and Teams
    both render."""
    lines = [title]
    for queue in summary["queues"]:
        reasons = ", ".join(f"{reason} {count}" for reason, count in queue["by_reason"].items())
        lines.append(f"{queue['queue_name']}: {queue['depth']} dead letter{'' if queue['depth'] == 1 else 's'}"
                     + (f" ({reasons})" if reasons else ""))
        if queue["depth"] and not queue["browsable"]:
            lines.append("  (this broker cannot list dead letters without taking them: depth only)")
        for group in queue["top_fingerprints"]:
            what = group["exception_type"] or "no exception"
            pattern = group["error_pattern"] if group["error_pattern"] is not None else "no error text"
            lines.append(f"  • {group['count']}× {what}: {pattern} [{group['fingerprint']}]")
            if group["sample_error"] is not None and group["sample_error"] != group["error_pattern"]:
                lines.append(f"    e.g. {group['sample_error']}")
        if queue["browsed"] < queue["depth"] and queue["browsable"]:
            lines.append(f"  (fingerprints of the first {queue['browsed']} dead letters)")
    return "\n".join(lines)


def webhook_payload(summary: Mapping[str, Any], *, conn_id: str, title: str,
                    context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document posted: ``text`` (the message) and ``babelqueue`` (the summary, the connection id, and
    the DAG, run and task the callback ran for, where the context says)."""
    where = _where(context or {})
    return {
        "text": summary_text(summary, title),
        "babelqueue": {"conn_id": conn_id, **where, "total_depth": summary["total_depth"],
                       "by_reason": summary["by_reason"], "queues": summary["queues"]},
    }


def _where(context: Mapping[str, Any]) -> dict[str, Any]:
    """``dag_id``, ``run_id`` and ``task_id`` from a callback's context (``None`` where the context has none)."""
    dag_run = context.get("dag_run")
    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(context.get("dag"), "dag_id", None) or getattr(dag_run, "dag_id", None)
    run_id = context.get("run_id") or getattr(dag_run, "run_id", None)
    return {"dag_id": dag_id, "run_id": run_id, "task_id": getattr(ti, "task_id", None)}


class BabelQueueDeadLetterNotifier(BaseNotifier):
    """Posts a summary of dead-letter queues to a webhook: usable as ``on_failure_callback`` /
    ``on_success_callback`` of a task or a DAG, or called with a context.

    The summary reads the DLQs when the callback runs (nothing is removed): each queue's depth, and on brokers
    that can browse their DLQ (SQL, Redis, Azure Service Bus) the counts by ``dead_letter.reason`` and by
    dead-letter source and the ``top`` error fingerprints of the first 1000 dead letters, each with its count,
    exception type, error pattern and one sample error. RabbitMQ, SQS and Pulsar give the depth only.

    :param webhook_conn_id: an ``http`` connection (templated): host = the webhook URL (or a host name, with the
        scheme in ``schema`` and a ``port``); password, if set, sent as ``Authorization: Bearer``.
    :param queue_names: the queues whose DLQs are summarised (templated; a list, or its JSON, Python or
        comma-separated text).
    :param babelqueue_conn_id: the BabelQueue connection the queues live on (templated).
    :param title: the message's first line (templated); by default it names the connection, the total and, in a
        callback, the DAG and task.
    :param endpoint: a path appended to the webhook URL (templated), for a connection that holds the host only.
    :param top: fingerprints listed per queue, most frequent first.
    :param timeout: seconds to wait for the webhook, so a slow receiver cannot hold a callback for long.
    :param skip_when_empty: post nothing when every DLQ is empty (for ``on_success_callback`` that should only
        speak up when there is something to look at).
    """

    template_fields: Sequence[str] = ("webhook_conn_id", "queue_names", "babelqueue_conn_id", "title", "endpoint")

    def __init__(
        self,
        *,
        webhook_conn_id: str,
        queue_names: str | Sequence[str],
        babelqueue_conn_id: str = DEFAULT_CONN_ID,
        title: str | None = None,
        endpoint: str | None = None,
        top: int = 5,
        timeout: float = 10.0,
        skip_when_empty: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise ValueError(f"top must be a whole number >= 0, got {top!r}")
        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.webhook_conn_id = webhook_conn_id
        self.queue_names = queue_names
        self.babelqueue_conn_id = babelqueue_conn_id
        self.title = title
        self.endpoint = endpoint
        self.top = top
        self.timeout = timeout
        self.skip_when_empty = skip_when_empty

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render the templated fields; a serialized DAG in the context (what Airflow hands a DAG-level callback
        under ``dag.test()``) cannot make a Jinja environment, so the default sandboxed one is used for it."""
        dag = context.get("dag") if isinstance(context, Mapping) else None
        if jinja_env is None and dag is not None and not hasattr(dag, "get_template_env"):
            context = {**context, "dag": _TemplatingDag(dag)}
        super().render_template_fields(context, jinja_env)

    def summary(self) -> dict[str, Any]:
        """Read the DLQs now (see :func:`~.engine.fingerprints.dead_letter_summary`)."""
        queue_names = parse_list(self.queue_names, "queue_names")
        if not queue_names:
            raise ValueError("queue_names must name at least one queue")
        hook = get_hook(self.babelqueue_conn_id)
        try:
            return dead_letter_summary(hook.get_binding(), queue_names, top=self.top)
        finally:
            hook.close()

    def _title(self, summary: Mapping[str, Any], context: Mapping[str, Any]) -> str:
        if not is_unset(self.title):
            return str(self.title)
        where = _where(context)
        total = summary["total_depth"]
        title = (f"BabelQueue: {total} dead letter{'' if total == 1 else 's'} on {self.babelqueue_conn_id} "
                 f"({', '.join(queue['queue_name'] for queue in summary['queues'])})")
        if where["dag_id"]:
            title += f" after {where['dag_id']}" + (f".{where['task_id']}" if where["task_id"] else "")
        return title

    def notify(self, context: Any) -> None:
        summary = self.summary()
        if self.skip_when_empty and not summary["total_depth"]:
            self.log.info("every dead-letter queue is empty: nothing posted")
            return
        payload = webhook_payload(summary, conn_id=self.babelqueue_conn_id, title=self._title(summary, context),
                                  context=context)
        self.post(payload)

    async def async_notify(self, context: Any) -> None:
        """The same as :meth:`notify`, off the event loop (for a notifier run in the triggerer)."""
        await asyncio.to_thread(self.notify, context)

    def _webhook(self) -> tuple[str, str | None, list[str]]:
        """``(url, token, secrets)``: the URL from the connection, its bearer token, and the texts never to show."""
        conn = BaseHook.get_connection(self.webhook_conn_id)
        if conn.conn_type not in WEBHOOK_CONN_TYPES:
            raise ConnectionConfigError(
                f"the webhook connection {self.webhook_conn_id!r} has type {conn.conn_type!r}; the notifier needs "
                "an 'http' connection whose host is the webhook URL"
            )
        host = (conn.host or "").strip()
        if not host:
            raise ConnectionConfigError(f"the webhook connection {self.webhook_conn_id!r} has no host (the URL)")
        if "://" not in host:
            scheme = conn.schema if conn.schema in ("http", "https") else "https"
            host = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
        if not is_unset(self.endpoint):
            host = f"{host.rstrip('/')}/{str(self.endpoint).lstrip('/')}"
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectionConfigError(
                f"the webhook connection {self.webhook_conn_id!r} must give an http:// or https:// URL, got "
                f"scheme {parts.scheme!r}"
            )
        token = conn.password or None
        secrets = [secret for secret in (token, parts.path.strip("/"), parts.query, parts.password) if secret]
        return host, token, secrets

    def post(self, payload: Mapping[str, Any]) -> None:
        """POST ``payload`` as JSON to the webhook; :class:`WebhookError` (naming the scheme and host only) when
        the receiver cannot be reached or answers with an error."""
        url, token, secrets = self._webhook()
        _mask(secrets)
        parts = urlsplit(url)
        where = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", ""))  # no userinfo, no path
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "airflow-provider-babelqueue"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - http(s) only
                status = response.status
                response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read(_RESPONSE_CHARS * 4).decode("utf-8", "replace")[:_RESPONSE_CHARS]
            raise WebhookError(f"the webhook at {where} refused the dead-letter summary: HTTP {exc.code} "
                               f"{scrub(exc.reason or '', secrets)}: {scrub(text, secrets)!r}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise WebhookError(f"could not post the dead-letter summary to the webhook at {where}: "
                               f"{scrub(str(reason), secrets)}") from None
        self.log.info("posted the dead-letter summary to %s (HTTP %d, %d bytes)", where, status, len(body))


class _TemplatingDag:
    """A DAG without the templating methods (a serialized DAG) as templates see it: every attribute read from it,
    plus the default sandboxed Jinja environment and plain-text rendering."""

    render_template_as_native_obj = False

    def __init__(self, dag: Any) -> None:
        self._dag = dag

    def get_template_env(self, force_sandboxed: bool = False) -> Any:
        from jinja2.sandbox import SandboxedEnvironment

        return SandboxedEnvironment(cache_size=0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dag, name)


def _mask(secrets: Sequence[str]) -> None:
    """Register the webhook's secrets with Airflow's log masker, where there is one."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - older task SDKs
        return
    for secret in secrets:
        if len(secret) >= 4:
            mask_secret(secret)
