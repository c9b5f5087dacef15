"""Redaction: the one rule for which parts of a URL or connection string are secret, and how they are hidden.

A binding's error message, a config's ``repr``, a hook's ``describe()`` and ``test_connection`` result are built
from URLs and connection strings that may carry credentials in three places: the URL's userinfo
(``postgresql://u:s3cret@h/db``), the URL's query (``?password=s3cret``, which libpq accepts; ``?token=``,
SAS ``?sig=``) and the ``Key=Value;`` segments of a connection string (Azure's ``SharedAccessKey=``). Airflow's
log masker knows none of them unless it is told, and ``test_connection``'s message reaches the UI unmasked, so
every string we build goes through these functions first.

Two ways to hide a secret, used together:

* **by structure** (:func:`redact_url`, :func:`redact_connection_string`, :func:`redact`): the value of each
  secret part becomes ``***`` and everything else (scheme, user, host, port, database, other parameters) stays,
  so a message still says where the failure happened;
* **by value** (:func:`url_secrets` then :func:`scrub`): the secret values themselves, raw and percent-decoded,
  are replaced wherever they occur, for text we did not build (a driver's exception message echoing a DSN).

Pure: standard library only, no Airflow, no broker client.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit, urlunsplit

__all__ = [
    "MASK",
    "config_repr",
    "is_secret_name",
    "redact",
    "redact_connection_string",
    "redact_url",
    "scrub",
    "url_password",
    "url_secrets",
]

#: What a secret is replaced by (Airflow's masker writes the same).
MASK = "***"

#: A parameter or segment name holding a secret, matched anywhere in the name, any case. ``sig`` covers SAS
#: signatures (``sig``, ``SharedAccessSignature``), ``sas`` SAS tokens passed whole, ``key`` API, SAS and account
#: keys, ``auth`` authorisation headers and tokens.
_SECRET_WORDS = re.compile(r"(?i)secret|passw(?:or)?d|pwd|key|token|credential|auth|sig|sas")
#: Names the rule above would catch that never hold a secret; hiding them only makes messages less useful:
#: Redis's ``key_prefix``, the SAS policy's *name* (``SharedAccessKeyName=RootManageSharedAccessKey``) and
#: libpq's ``sslkey`` (a file path; the key's passphrase is ``sslpassword``, which stays secret).
_NOT_SECRET = frozenset({"key_prefix", "sharedaccesskeyname", "sslkey"})
#: One ``Name=value`` segment of a connection string (``;``-separated, Azure's and ADO's form).
_SEGMENT = re.compile(r"(?P<lead>(?:^|;)\s*)(?P<name>[A-Za-z_][\w.\-]*)(?P<eq>\s*=)(?P<value>[^;]*)")


def is_secret_name(name: str) -> bool:
    """Whether a URL query parameter, connection-string segment or extra called ``name`` holds a secret.

    Matched by words rather than a list of known names: a driver we never heard of (``?api_token=``) is hidden
    too, and a false positive costs only a less useful message.
    """
    normalized = name.strip().lower()
    return normalized not in _NOT_SECRET and _SECRET_WORDS.search(normalized) is not None


def _is_connection_string(text: str) -> bool:
    """``Key=Value;...`` text (not a URL): at least one ``;`` segment or a leading ``Name=``."""
    return "://" not in text.split(";", 1)[0].split("=", 1)[0] and _SEGMENT.match(text) is not None


def url_password(url: str | None) -> str | None:
    """The password in a URL's userinfo, percent-decoded, or ``None`` (no URL, no password, unparsable)."""
    if not url or "://" not in url or "@" not in url:
        return None
    try:
        password = urlsplit(url.strip()).password
    except ValueError:
        return None
    return unquote(password) if password else None


def _query_pairs(query: str) -> list[tuple[str, str]]:
    """``(name, raw value)`` of each ``&``-separated parameter, undecoded (so it can be found in text)."""
    pairs = []
    for item in query.split("&"):
        name, _, value = item.partition("=")
        pairs.append((unquote_plus(name), value))
    return pairs


def _redact_query(query: str) -> str:
    out = []
    for item in query.split("&"):
        name, eq, value = item.partition("=")
        out.append(f"{name}={MASK}" if eq and value and is_secret_name(unquote_plus(name)) else item)
    return "&".join(out)


def redact_url(url: str) -> str:
    """``url`` with its userinfo password and the values of its secret query parameters replaced by ``***``.

    ``postgresql://u:pw@db:5432/app?password=pw&sslmode=require`` becomes
    ``postgresql://u:***@db:5432/app?password=***&sslmode=require``: scheme, user, host, port, path and the other
    parameters stay, so a message still says where. Text that is not a URL is returned as it is; an unparsable
    URL as ``(an unparsable URL)`` (its parts cannot be told apart, so none of it can be shown safely).
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "(an unparsable URL)"
    netloc = parts.netloc
    if password is not None:
        netloc = f"{parts.username or ''}:{MASK}@{netloc.rpartition('@')[2]}"
    query = _redact_query(parts.query) if parts.query else parts.query
    fragment = _redact_query(parts.fragment) if "=" in parts.fragment else parts.fragment
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment))


def redact_connection_string(text: str) -> str:
    """``Key=Value;`` text with the value of each secret segment replaced by ``***``.

    ``Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=abc=`` keeps its endpoint
    and policy name and becomes ``...;SharedAccessKey=***``. ``SharedAccessSignature=...`` is hidden whole; a URL
    inside a segment (the ``Endpoint``) goes through :func:`redact_url`.
    """

    def one(match: re.Match[str]) -> str:
        name, value = match.group("name"), match.group("value")
        if is_secret_name(name) and value.strip():
            value = MASK
        elif "://" in value:
            value = redact_url(value)
        return f"{match.group('lead')}{name}{match.group('eq')}{value}"

    return _SEGMENT.sub(one, text)


def redact(value: str) -> str:
    """A URL through :func:`redact_url`, a connection string through :func:`redact_connection_string`, other
    text unchanged: for a value whose form is not known in advance (a config field, a hook's host)."""
    if _is_connection_string(value):
        return redact_connection_string(value)
    if "://" in value:
        return redact_url(value)
    return value


def _decoded_forms(raw: str, plus: bool) -> list[str]:
    forms = [raw, unquote(raw)]
    if plus:
        forms.append(unquote_plus(raw))
    return forms


def url_secrets(text: str | None) -> list[str]:
    """Every secret value in a URL or connection string, as written and percent-decoded, longest first.

    A URL's userinfo password and secret query parameters; a connection string's secret segments, and the
    secrets of any URL or SAS token inside a segment (``SharedAccessSignature=SharedAccessSignature sr=…&sig=…``
    gives the whole token and its ``sig``). Empty for text holding no secret part, or for ``None``.
    """
    if not text:
        return []
    found: list[str] = []
    if _is_connection_string(text):
        for match in _SEGMENT.finditer(text):
            name, value = match.group("name"), match.group("value").strip()
            if not value:
                continue
            if is_secret_name(name):
                found.extend(_decoded_forms(value, plus=False))
                if "=" in value:  # a SAS token: sr=…&sig=…&se=…&skn=…, after an optional "SharedAccessSignature "
                    found.extend(url_secrets("x://h/?" + value.rpartition(" ")[2]))
            elif "://" in value:
                found.extend(url_secrets(value))
    elif "://" in text:
        try:
            parts = urlsplit(text.strip())
            if parts.password is not None:
                found.extend(_decoded_forms(parts.netloc.rpartition("@")[0].partition(":")[2], plus=False))
        except ValueError:
            return []
        for section in (parts.query, parts.fragment):
            for name, raw in _query_pairs(section) if "=" in section else []:
                if raw and is_secret_name(name):
                    found.extend(_decoded_forms(raw, plus=True))
    return sorted({form for form in found if form}, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret replaced by ``***``, also in its percent-encoded forms (``%40`` for ``@``, ``+``
    for a space). Longer secrets go first, so one that contains another is hidden whole. Empty secrets are
    skipped; callers drop values too short to scrub without garbling the message (see the hooks)."""
    for secret in sorted({secret for secret in secrets if secret}, key=len, reverse=True):
        for form in dict.fromkeys((secret, quote(secret, safe=""), quote_plus(secret), quote(secret))):
            text = text.replace(form, MASK)
    return text


def config_repr(config: Any) -> str:
    """A dataclass's ``repr`` (its ``repr=True`` fields, in order) with URLs and connection strings redacted.

    Assign it as a config's ``__repr__``: a frozen config prints its endpoint URLs in task logs and tracebacks,
    and such a URL may carry a password or token the field-level ``repr=False`` cannot reach.
    """
    shown = []
    for item in dataclasses.fields(config):
        if item.repr:
            value = getattr(config, item.name)
            shown.append(f"{item.name}={(redact(value) if isinstance(value, str) else value)!r}")
    return f"{type(config).__name__}({', '.join(shown)})"
