"""Optional per-URN payload validation with JSON Schema (draft 7).

The envelope contract says nothing about the shape of ``data``; teams that agree a schema per URN can
check payloads before publishing or while consuming. This follows the conformance suite's
``payload_schema`` block, so every SDK's validator agrees on which payloads are valid.

It uses ``jsonschema`` (already an Airflow dependency) and is kept out of the pure envelope module.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import orjson
from jsonschema import Draft7Validator

from .envelope import data_of, urn_of

__all__ = ["PayloadSchemas", "payload_errors"]


@lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Draft7Validator:
    schema = orjson.loads(schema_json)
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def payload_errors(data: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every way ``data`` breaks ``schema``, as ``"<json pointer>: <message>"`` lines; empty when valid.

    :param schema: a draft-7 JSON Schema; it is checked itself, so a broken schema fails loudly
        (``jsonschema.SchemaError``) instead of accepting everything. Compiled validators are cached.
    """
    validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    errors = sorted(validator.iter_errors(data), key=lambda error: list(error.absolute_path))
    return [f"/{'/'.join(str(part) for part in error.absolute_path)}: {error.message}" for error in errors]


class PayloadSchemas:
    """A URN → schema registry, for checking whole envelopes.

    :param schemas: one draft-7 schema per URN; URNs without a schema are not checked (opt-in).
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]]) -> None:
        self.schemas = dict(schemas)
        for schema in self.schemas.values():
            _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))

    def errors(self, envelope: Mapping[str, Any]) -> list[str]:
        """The payload's schema errors for its URN; empty when valid or when the URN has no schema."""
        schema = self.schemas.get(urn_of(envelope))
        return [] if schema is None else payload_errors(data_of(envelope), schema)
