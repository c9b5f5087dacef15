"""Pulsar's admin REST API, behind the binding's counts: the binary protocol has no way to ask how many messages
wait, so ``depth`` and ``dead_letter_depth`` read a topic's stats over HTTP.

Errors name the URL, the status and the broker's reason with a hint of what to check, and never the token.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from ..base import BindingError
from ..redaction import redact, scrub, url_secrets
from .config import PulsarConfig

__all__ = ["admin_get"]


_ADMIN_HINTS = {
    401: "the admin API refused the token (401); check the connection's token",
    403: "the token's role may not read this topic's stats (403); grant it the namespace's consume or admin rights",
}


def admin_get(config: PulsarConfig, path: str, context: ssl.SSLContext | None = None) -> dict[str, Any] | None:
    """GET one admin REST document; ``None`` for a 404 (the topic does not exist).

    :raises BindingError: naming the URL, the status and the broker's ``reason``, with a hint; never the token.
    """
    url = config.admin_url.rstrip("/") + path
    headers = {"Accept": "application/json"} | ({"Authorization": f"Bearer {config.token}"} if config.token else {})
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=config.admin_timeout, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        try:
            reason = json.loads(exc.read() or b"{}").get("reason", "")
        except (ValueError, AttributeError):
            reason = ""
        hint = _ADMIN_HINTS.get(exc.code, f"the admin API answered {exc.code}")
        raise BindingError(f"Pulsar admin {redact(url)}: {hint}{f' ({reason})' if reason else ''}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        text = str(getattr(exc, "reason", exc))
        text = text.replace(config.token, "***") if config.token else text
        text = scrub(text, url_secrets(url))
        raise BindingError(
            f"Pulsar admin {redact(url)}: cannot read topic stats: check admin_url, that the broker's web service "
            "listens "
            f"there, and its TLS settings ({type(exc).__name__}: {text})"
        ) from exc
