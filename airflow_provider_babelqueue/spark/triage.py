"""Spark job: dead-letter triage. Drain records (JSON Lines) in, one deduplicated Parquet row per dead letter out.

Run it with ``spark-submit triage.py --input <paths/globs/folders> --output <folder> [--source-broker NAME]``.
See ``docs/spark.md`` for the output schema. What the official SDKs store besides bare envelopes is read as the
core reads it: a header frame (``core.frames``) gives its inner envelope, and the Python SDK's poison wrapper
(``core.peer``) is a poison row. Only native Spark expressions are used (no Python UDF), so the job scales with
the cluster; the only project imports are pure core modules: the envelope (reason codes) and the error fingerprint's
definition (``core.fingerprint``: the masks, the poison error texts).
"""

from __future__ import annotations

import functools
import json
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

try:
    from airflow_provider_babelqueue.core.envelope import Reason
    from airflow_provider_babelqueue.core.fingerprint import (
        ERROR_CHARS,
        FINGERPRINT_CHARS,
        FINGERPRINT_SEPARATOR,
        MASKS,
        OWN_POISON_ERRORS,
        POISON_INVALID_FRAME,
        POISON_INVALID_JSON,
        POISON_INVALID_UTF8,
        POISON_WRAPPED,
    )
    from airflow_provider_babelqueue.spark.common import (
        base_parser,
        get_spark,
        join_url,
        log_warning,
        print_summary,
        short_exception,
        stop_spark,
        write_text,
    )
except ImportError as exc:  # pragma: no cover - a cluster without the package on its Python path
    raise SystemExit(f"cannot import airflow_provider_babelqueue ({exc}); pass the package zip with --py-files "
                     "(see docs/spark.md)") from exc

__all__ = ["COLUMNS", "MAX_NAME_CHARS", "PLAIN_COLUMNS", "POISON_INVALID_FRAME", "POISON_INVALID_JSON",
           "POISON_INVALID_UTF8", "POISON_WRAPPED", "RECORD_OPTIONS", "RECORD_SCHEMA", "TOO_LARGE", "TORN",
           "UNKNOWN_VERSION", "UNREADABLE_CAUSES", "classify", "deduplicate", "derive", "main", "parquet_options",
           "read_lines", "read_records", "run_summary", "triage", "unreadable_warning", "with_error_pattern"]

#: The drain record (docs/drain-records.md), read with an explicit schema.
RECORD_SCHEMA = T.StructType([
    T.StructField("v", T.LongType()),
    T.StructField("body", T.StringType()),
    T.StructField("body_encoding", T.StringType()),
    T.StructField("broker", T.StringType()),
    T.StructField("queue_name", T.StringType()),
    T.StructField("dead_letter_queue", T.StringType()),
    T.StructField("source_conn_id", T.StringType()),
    T.StructField("meta_id", T.StringType()),
    T.StructField("delivery_count", T.LongType()),
    T.StructField("native_reason", T.StringType()),
    T.StructField("drained_at", T.LongType()),
])

# The body is parsed in one pass with meta and dead_letter as objects, their count and time fields (_NUMBERS) as
# JSON integers and every other field as text (a JSON string gives its text, any other value its JSON text). A
# body that pass cannot read whole (not a JSON object, meta/dead_letter not objects, a number field that is not
# an integer within a long) is parsed again in two levels: every top-level field as text first, then meta and
# dead_letter from their text, the number fields cast leniently from their text (a quoted "4" is 4, 2.5 or a
# value beyond a long is unknown). So a field of an unexpected type never hides a well-formed body: only bodies
# that are not a JSON object land in _corrupt and become poison. The one-pass parse gives the same values as the
# two-level one and costs much less (Spark re-serializes every non-string value it reads as text, with a new
# JSON writer each time), and the second parse runs only for the few odd bodies.
#
# Two shapes the official SDKs store are not bare envelopes. The Python SDK's poison wrapper (core.peer: ``raw``,
# ``raw_encoding`` and a ``dead_letter`` block) is read by both parses: ``raw`` and ``raw_encoding`` as variants,
# which keep the JSON type of a value (``raw`` must be a JSON string). The header frame (core.frames:
# ``__bq_frame``, ``headers`` and the envelope as a JSON string in ``body``) is opened before the parse, by a small
# parse of its own keys (_FRAME_SCHEMA, variants again: a frame's ``body`` must be a string, not the object its
# text would also be), and the parse then reads the inner envelope. That small parse runs only for a body whose
# text holds the marker: a bare envelope pays for one substring search.
_CORRUPT = "_corrupt"
_FRAME = "__bq_frame"
_FRAME_MARK = f'"{_FRAME}"'
_NUMBERS = frozenset({"schema_version", "created_at", "failed_at", "attempts"})
_META_FIELDS = ("id", "queue", "lang", "schema_version", "created_at")
_DEAD_LETTER_FIELDS = ("reason", "error", "exception", "failed_at", "original_queue", "attempts", "lang")
_TOP_FIELDS = ("job", "urn", "trace_id", "data", "attempts")
_WRAPPER_FIELDS = ("raw", "raw_encoding")
#: Keys an envelope has and a poison wrapper never has (as core.peer reads a wrapper).
_ENVELOPE_KEYS = ("job", "urn", "meta", "data", "trace_id")


def _fields(names: Sequence[str], typed: bool) -> list[T.StructField]:
    """String fields, or (``typed``) with the :data:`_NUMBERS` among them as longs."""
    return [T.StructField(name, T.LongType() if typed and name in _NUMBERS else T.StringType()) for name in names]


def _variants(names: Sequence[str]) -> list[T.StructField]:
    """Variant fields: they keep a value's JSON type, which a string field turns into text."""
    return [T.StructField(name, T.VariantType()) for name in names]


_META_SCHEMA = T.StructType(_fields(_META_FIELDS, typed=False))
_DEAD_LETTER_SCHEMA = T.StructType(_fields(_DEAD_LETTER_FIELDS, typed=False))
_BODY_SCHEMA = T.StructType(_fields((*_TOP_FIELDS, "meta", "dead_letter"), typed=False) + _variants(_WRAPPER_FIELDS)
                            + [T.StructField(_CORRUPT, T.StringType())])
_NESTED_BODY_SCHEMA = T.StructType(
    _fields(_TOP_FIELDS, typed=True)
    + [T.StructField("meta", T.StructType(_fields(_META_FIELDS, typed=True))),
       T.StructField("dead_letter", T.StructType(_fields(_DEAD_LETTER_FIELDS, typed=True)))]
    + _variants(_WRAPPER_FIELDS) + [T.StructField(_CORRUPT, T.StringType())]
)
# (``headers`` as text: a variant refuses an object with a repeated key, which core.frames takes, the last one
# winning; an object's text starts with "{")
_FRAME_SCHEMA = T.StructType(_variants((_FRAME,)) + [T.StructField("headers", T.StringType())] + _variants(("body",))
                             + [T.StructField(_CORRUPT, T.StringType())])
#: What :func:`_parse_body` gives, either way: ``poison`` (the text is no JSON object), ``framed`` (the text came
#: out of a header frame), the envelope's fields, and a poison wrapper's two keys (:data:`_WRAPPER_SQL` reads them).
_PARSED = T.StructType([T.StructField("poison", T.BooleanType()), T.StructField("framed", T.BooleanType())]
                       + [field for field in _NESTED_BODY_SCHEMA.fields if field.name != _CORRUPT])
#: Jackson's limits, as Spark's JSON options name them (``JSONOptions``: ``maxStringLen``, default 20,000,000
#: characters; ``maxNumLen``, default 1,000 digits; ``maxNestingDepth``, default 1,000). Strings and numbers are
#: read whatever their length (Java's own limit); a body is as deep as the core's parser allows (orjson: 1,024).
_MAX = str(2**31 - 1)
_CORE_DEPTH = 1024
_LIMITS = {"maxStringLen": _MAX, "maxNumLen": _MAX}
#: The body's parse: strict JSON as the core reads it (no NaN/Infinity, no single quotes; Spark allows both by
#: default), Jackson's limits raised (:data:`_LIMITS`), as deep as the core's parser goes.
_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT, "allowNonNumericNumbers": "false",
                 "allowSingleQuotes": "false", **_LIMITS, "maxNestingDepth": str(_CORE_DEPTH)}
#: The drain record's read: every limit raised (a record's body is one JSON string of any length).
RECORD_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record", **_LIMITS,
                  "maxNestingDepth": _MAX}

# The poison error texts (POISON_*), the error masks and the fingerprint's parts come from core.fingerprint, the
# one definition: the provider's Python code (the dead-letter trigger, the notifier) computes the same values.


def with_error_pattern(df: DataFrame, error: str = "error", name: str = "error_pattern") -> DataFrame:
    """Add ``name``: the error text with its variable parts masked, so similar errors group: quoted strings →
    ``<str>``, UUIDs → ``<uuid>``, hex ids (``0x…`` or 8+ hex chars with a digit and a letter) → ``<hex>``,
    numbers → ``<n>``; whitespace runs collapse to one space. Only the first 2,000 characters count. The masks
    are core.fingerprint's (:data:`~airflow_provider_babelqueue.core.fingerprint.MASKS`), whose ``error_pattern``
    gives the same text in plain Python.

    Each mask is one regular-expression pass over the text; a pass is skipped for an error that lacks every
    character its pattern needs (most errors have no quote, no UUID and no whitespace run), which gives the
    same text for less work. One column per step keeps the plan linear (a step reads its input twice).

    :param df: rows with an ``error`` column.
    :param error: the column holding the error text.
    :param name: the column to add.
    """
    scratch = "_mask_text"
    source, text = F.col(error), F.col(scratch)
    # no more bytes than the limit in characters: nothing to cut (counting characters walks the text)
    short = F.octet_length(source) <= ERROR_CHARS
    df = df.withColumn(scratch, F.when(short, source).otherwise(F.substring(source, 1, ERROR_CHARS)))
    for pattern, mask, needs in MASKS:
        replaced = F.regexp_replace(text, pattern, mask)
        if needs:
            present = functools.reduce(operator.or_, [source.contains(needle) for needle in needs])
            replaced = F.when(present, replaced).otherwise(text)
        df = df.withColumn(scratch, replaced)
    return df.withColumn(name, F.trim(text)).drop(scratch)


def _text_sql(column: str) -> str:
    """SQL for a JSON string field read as text: blank (or absent) → null."""
    return f"CASE WHEN trim({column}) != '' THEN {column} END"


def _bind(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` computed once however often ``body`` uses it (a let-binding: the value is
    the one element of an array that ``transform`` maps)."""
    return F.transform(F.array(value), body)[0]


def _string(value: Column) -> Column:
    """A variant's text when it holds a JSON string, else null (a number or an object is not text here)."""
    return F.when(F.schema_of_variant(value) == "STRING", F.variant_get(value, "$", "string"))


def _one_pass(n: Column, framed: Column) -> Column:
    """A :data:`_PARSED` struct from a one-pass parse that read the whole body (no corrupt record)."""
    return F.struct(F.lit(False).alias("poison"), framed.alias("framed"),
                    *[n[field.name].alias(field.name) for field in _PARSED.fields[2:]])


def _parse(text: Column, framed: Column) -> Column:
    """The text parsed as a :data:`_PARSED` struct (see _BODY_SCHEMA for the two ways), ``framed`` in it."""
    def two_level(b: Column) -> Column:
        readable = b.isNotNull() & b[_CORRUPT].isNull()
        as_text = F.struct((~readable).alias("poison"), framed.alias("framed"),
                           *[b[name].alias(name) for name in _TOP_FIELDS],
                           F.when(readable, F.from_json(b["meta"], _META_SCHEMA, _JSON_OPTIONS)).alias("meta"),
                           # (a block that is not an object stays unknown: a poison wrapper needs an object)
                           F.when(readable & b["dead_letter"].startswith("{"),
                                  F.from_json(b["dead_letter"], _DEAD_LETTER_SCHEMA, _JSON_OPTIONS))
                           .alias("dead_letter"), *[b[name].alias(name) for name in _WRAPPER_FIELDS])
        return as_text.try_cast(_PARSED)  # the numbers field by field, a failed one unknown

    # (the text is cheap to compute again: the body itself, or a base64 decode for the rare odd body)
    return _bind(F.from_json(text, _NESTED_BODY_SCHEMA, _JSON_OPTIONS), lambda n: F.when(
        n.isNotNull() & n[_CORRUPT].isNull(), _one_pass(n, framed)).otherwise(
        _bind(F.from_json(text, _BODY_SCHEMA, _JSON_OPTIONS), two_level)))


def _parse_body(text: Column) -> Column:
    """The body text parsed, as one struct (:data:`_PARSED`), as :func:`_checked_parse` gives it, reading most
    bodies in one parse: a bare body (no frame marker) is parsed inside ``{"v":[<text>]}``
    (:data:`_WHOLE_SCHEMA`), which reads its fields and counts its values at once. When that parse reads one
    object, typed fields and all, the check of one value needs no more for a text without a ``]`` (the array can
    only close where the text ends) and only the ``[text,{}]`` parse for one with a ``]`` (:func:`_one_value`),
    and the other refusals are looked for as :func:`_refused` does; the fields are then those of
    :func:`_checked_parse`'s one-pass parse, which reads the same tokens. Every other body (a frame, a corrupt
    record: poison or a field of an odd type, anything but one object) goes to :func:`_checked_parse`.
    """
    whole = F.when(~text.contains(_FRAME_MARK),
                   F.from_json(F.concat(F.lit('{"v":['), text, F.lit("]}")), _WHOLE_SCHEMA, _WHOLE_OPTIONS))

    def read(w: Column) -> Column:
        values = w["v"]
        one = (w[_CORRUPT].isNull() & (F.size(values) == 1) & values[0].isNotNull()
               & (~text.contains("]") | _holds(text, ",{}]", 2, _WRAPPED_OPTIONS)) & ~_refused_value(text))
        return F.when(F.coalesce(one, F.lit(False)), _one_pass(values[0], F.lit(False))).otherwise(
            _checked_parse(text))

    return _bind(whole, read)


def _checked_parse(text: Column) -> Column:
    """The body text parsed, as one struct (:data:`_PARSED`): ``poison`` (not a JSON object, or no text),
    ``framed``, the top-level fields as text, and ``meta`` and ``dead_letter`` as structs of text fields. A header
    frame gives its inner envelope's fields; one that core.frames would not open gives no text, so poison.

    core.frames opens a frame with the number 1 as ``__bq_frame``, ``headers`` an object (or absent) and ``body`` a
    JSON string, and reads a frame inside a frame as an envelope; so does this. Only a body whose text holds
    ``"__bq_frame"`` is looked at (a key spelled with JSON escapes is not taken for the marker).

    One expression does the whole parse: Spark evaluates ``from_json`` outside its generated code, in a
    projection that copies every column of the row, so one such projection instead of one per step copies each
    body once instead of three times. ``_bind`` lets the steps share a value without a column for it. The text to
    parse is chosen before the parse, so the parse appears once in the plan (planning a larger expression costs
    the driver measurably), and what is decided from the parsed fields alone (a poison wrapper) is left to the
    SQL columns of :func:`classify`.
    """
    def opened(text: Column, f: Column) -> Column:
        # (a frame's body that is an object Spark cannot hold as a variant is null here; the other keys still read)
        framed = f[_FRAME].isNotNull()
        usable = ((F.schema_of_variant(f[_FRAME]) == "BIGINT") & (F.to_json(f[_FRAME]) == "1")
                  & (f["headers"].isNull() | f["headers"].startswith("{")))
        inner = _bind(_string(f["body"]), lambda i: F.when(~_refused(i), i))
        return _parse(F.when(~framed, text).when(usable, inner), framed)

    # the frame's own keys are parsed only when the text holds the marker (null for every other body); a text the
    # core refuses is no text (poison)
    return _bind(F.when(~_refused(text), text), lambda usable: _bind(
        F.when(usable.contains(_FRAME_MARK), F.from_json(usable, _FRAME_SCHEMA, _JSON_OPTIONS)),
        functools.partial(opened, usable)))


#: An array of empty structs: parsing ``[<text>]`` as one skips every value (an object is read as no fields).
_SKIP_ALL = T.ArrayType(T.StructType([]))
#: One level more than a body may have: the brackets around it.
_WRAPPED_OPTIONS = {**_JSON_OPTIONS, "maxNestingDepth": str(_CORE_DEPTH + 1)}
del _WRAPPED_OPTIONS["columnNameOfCorruptRecord"]
#: A bare body inside ``{"v":[<text>]}``: its one-pass fields, and the number of values the text holds. A failure
#: anywhere (a field of an odd type included) gives a corrupt record, which the root object alone can hold.
_WHOLE_SCHEMA = T.StructType([
    T.StructField("v", T.ArrayType(T.StructType([f for f in _NESTED_BODY_SCHEMA.fields if f.name != _CORRUPT]))),
    T.StructField(_CORRUPT, T.StringType())])
#: Two levels more than a body may have: the object and the array around it.
_WHOLE_OPTIONS = {**_JSON_OPTIONS, "maxNestingDepth": str(_CORE_DEPTH + 2)}
_HIGH, _LOW = r"\\u[dD][89abAB][0-9a-fA-F]{2}", r"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
#: A ``\u`` escape of a high surrogate not followed by a low one, or of a low one not after a high one (with every
#: escaped backslash already replaced by another character, so each backslash left starts an escape).
_LONE_SURROGATE = f"{_HIGH}(?!{_LOW})|(?<!{_HIGH}){_LOW}"
#: What a number literal beyond a long or a double needs, where JSON puts one (after ``:``, ``,`` or ``[`` and
#: whitespace): an integer part of 19 digits or more, or an exponent of 3 digits or more that is not negative. A
#: literal's own place keeps the ids out: a hex id's ``5e123`` or a 19-digit card number in a string are not after
#: a ``:`` (a string that holds ``: 1e400`` still matches; the exact test then reads it as text).
_WIDE_LITERAL = r"[:,\[][ \t\r\n]*-?[0-9](?:[0-9]{18}|[0-9]*(?:\.[0-9]+)?[eE]\+?[0-9]{3})"
#: Either need in one scan, for the text that has neither (nearly every body): a ``\uD`` escape, or
#: :data:`_WIDE_LITERAL`'s start. It matches a little more (``:ud``, a backslash before digits); the exact tests
#: then decide.
_VALUE_CANDIDATE = r"[:,\[\\](?:u[dD]|[ \t\r\n]*-?[0-9](?:[0-9]{18}|[0-9]*(?:\.[0-9]+)?[eE]\+?[0-9]{3}))"
#: A JSON number (as core.integers finds them: not part of another); an integer when it has no ``.``/``e``.
_NUMBER_LITERAL = r"(?<![0-9.eE+\-])-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"


def _outside_strings(text: Column) -> Column:
    """The text with every JSON string removed (core.integers._outside_strings): escaped backslashes and quotes
    go first, then every other piece between quotes is a string's content."""
    plain = F.replace(F.replace(text, F.lit("\\\\"), F.lit("")), F.lit('\\"'), F.lit(""))
    return F.array_join(F.filter(F.split(plain, '"'), lambda _, i: i % 2 == 0), "")


def _out_of_range(number: Column) -> Column:
    """A JSON number literal the core refuses: an integer outside signed 64-bit, a float beyond a double."""
    return F.when(number.rlike("^-?[0-9]+$"), number.try_cast("bigint").isNull()).otherwise(
        F.abs(number.try_cast("double")) == F.lit(float("inf")))


def _refused(text: Column) -> Column:
    """Whether the core's ``decode`` refuses a text that Spark's parse would read as a JSON object (``False`` for
    what both read, and for what Spark's parse already refuses; ``True`` for no text).

    Spark's parser reads what follows the first JSON value as nothing (``{…} x``), turns a lone surrogate escape
    into ``?`` and reads numbers as text wherever a field is read as text. The core refuses all three: text after
    the value, a lone surrogate, an integer outside signed 64-bit or a float beyond a double (core.integers). So:

    * one value: ``[text]`` must hold one element and ``[text,{}]`` two. Text after the value breaks the first
      (``{…} x``, ``{…}}``), adds elements to it (``{…},{…}``), or closes it early (``{…}]``: the second then
      has one). Both parses skip every value (:data:`_SKIP_ALL`), with the body parse's limits. The second is
      made only for a text holding a ``]``: without one, the ``]`` appended is the only one, so the first parse's
      array ends where the text does and holds all of it;
    * a lone surrogate, looked for only in a text with a ``\\uD`` escape;
    * a number out of range, looked for (outside strings, literal by literal) only in a text where
      :data:`_WIDE_LITERAL` finds a candidate (a body of hex ids passes).

    One scan (:data:`_VALUE_CANDIDATE`) clears nearly every text of the last two at once.
    """
    return ~_one_value(text, _WRAPPED_OPTIONS) | _refused_value(text)


def _refused_value(text: Column) -> Column:
    """Whether a text that is one JSON value holds a lone surrogate escape or a number out of range (see
    :func:`_refused`)."""
    escapes = text.contains("\\ud") | text.contains("\\uD")
    lone = F.replace(text, F.lit("\\\\"), F.lit("_")).rlike(_LONE_SURROGATE)
    wide = F.exists(F.regexp_extract_all(_outside_strings(text), F.lit(_NUMBER_LITERAL), 0), _out_of_range)
    return text.rlike(_VALUE_CANDIDATE) & ((escapes & lone) | (text.rlike(_WIDE_LITERAL) & wide))


def _holds(text: Column, suffix: str, elements: int, options: dict[str, str]) -> Column:
    """Whether ``[<text><suffix>`` parses (skipping every value) as an array of ``elements`` elements."""
    values = F.from_json(F.concat(F.lit("["), text, F.lit(suffix)), _SKIP_ALL, options)
    return F.coalesce(F.size(values) == elements, F.lit(False))


def _one_value(text: Column, options: dict[str, str]) -> Column:
    """Whether the text is one JSON value (an object, or null) and nothing else but whitespace: ``[text]`` holds
    one element and, when the text holds a ``]`` (which could close that array early), ``[text,{}]`` two (see
    :func:`_refused`). ``False`` for no text."""
    # (Spark evaluates AND and OR lazily: the second parse runs only where it can change the answer)
    return _holds(text, "]", 1, options) & (~text.contains("]") | _holds(text, ",{}]", 2, options))


def _variant_text_sql(field: str) -> str:
    """SQL for a variant field's text when it holds a JSON string, else null."""
    return f"CASE WHEN schema_of_variant({field}) = 'STRING' THEN variant_get({field}, '$', 'string') END"


_RAW_SQL, _RAW_ENCODING_SQL = _variant_text_sql("_p.raw"), _variant_text_sql("_p.raw_encoding")
#: SQL: the parsed body ``_p`` is the Python SDK's poison wrapper, by core.peer's rules: a string ``raw``, an object
#: ``dead_letter``, ``raw_encoding`` absent, ``utf-8``, or ``base64`` with ``raw`` strict base64 (Spark's own
#: decoder also takes text without its padding), and none of an envelope's keys. A bare envelope has no ``raw``,
#: so the first test settles it. Never null (an encoding that is no string compares as unknown).
_WRAPPER_SQL = (
    f"coalesce(_p.raw IS NOT NULL AND {_RAW_SQL} IS NOT NULL AND _p.dead_letter IS NOT NULL AND "
    + " AND ".join(f"_p.{key} IS NULL" for key in _ENVELOPE_KEYS)
    + f" AND (_p.raw_encoding IS NULL OR is_variant_null(_p.raw_encoding) OR {_RAW_ENCODING_SQL} = 'utf-8' OR "
    f"({_RAW_ENCODING_SQL} = 'base64' AND length({_RAW_SQL}) % 4 = 0 AND {_RAW_SQL} RLIKE '^[A-Za-z0-9+/]*={{0,2}}$')),"
    " false)"
)


#: Why an input line is not triaged (:func:`read_lines`' ``unreadable`` column; the summary's
#: ``unreadable_by_cause`` names all three, in this order).
TORN, TOO_LARGE, UNKNOWN_VERSION = "torn", "too_large", "unknown_version"
UNREADABLE_CAUSES = (TORN, TOO_LARGE, UNKNOWN_VERSION)
#: Jackson's longest object key (StreamReadConstraints.maxNameLength): Spark's JSON options do not raise it.
MAX_NAME_CHARS = 50_000


def read_lines(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Every drain record line of every input path, with ``input_file`` and ``unreadable``: null for a record
    triage reads (``v`` 1 and a ``body``), else why not (:data:`UNREADABLE_CAUSES`). Blank lines are no records
    (Spark's reader gives no row for them, as ``core.records.parse_replay_line`` gives ``None``).

    The lines are read PERMISSIVE, with Jackson's limits raised (:data:`RECORD_OPTIONS`): a body of any length
    is read. A line Spark cannot read keeps its text in a corrupt-record column, and its cause is:

    * ``unknown_version``: a JSON object without ``v`` 1 or without a ``body`` (a field of another type is not
      read; when ``v`` and ``body`` are, the record is triaged, its other fields of the wrong type unknown);
    * ``too_large``: a line Spark could not read at all that holds an object key of more than
      :data:`MAX_NAME_CHARS` characters, Jackson's one limit Spark's options cannot raise;
    * ``torn``: anything else that is not one JSON object: the torn last line of a crashed drain, a truncated or
      garbled line, bytes that are not UTF-8, a JSON value that is not an object.

    No ``encoding`` option: Spark then hands each line's bytes to Jackson's UTF-8 parser, which rejects
    bytes that are not UTF-8 just as the decoding reader the option sets up does, for ~30 % less time in the
    scan.
    """
    corrupt = RECORD_OPTIONS["columnNameOfCorruptRecord"]
    schema = T.StructType([*RECORD_SCHEMA.fields, T.StructField(corrupt, T.StringType())])
    lines = spark.read.schema(schema).options(**RECORD_OPTIONS).json(list(paths))
    line = F.col(corrupt)
    # only for a line Spark read nothing of (rare): is it one JSON object, or one with a key over Jackson's limit?
    one_object = _one_value(line, {key: value for key, value in RECORD_OPTIONS.items() if key != "mode"
                                   and key != "columnNameOfCorruptRecord"}) & line.rlike("^\\s*\\{")
    long_key = line.rlike(f'"[^"]{{{MAX_NAME_CHARS + 1},}}+"\\s*:')
    nothing_read = line.isNotNull() & F.col("v").isNull() & F.col("body").isNull()
    # (Spark keeps the bytes of a line that is not UTF-8 as its corrupt text: not a JSON text)
    cause = (F.when(~F.is_valid_utf8(line), F.lit(TORN))
             .when((F.col("v") == 1) & F.col("body").isNotNull(), F.lit(None).cast("string"))
             .when(~nothing_read | one_object, F.lit(UNKNOWN_VERSION))
             .when(long_key, F.lit(TOO_LARGE)).otherwise(F.lit(TORN)))
    return lines.select(*RECORD_SCHEMA.names, F.col("_metadata.file_path").alias("input_file"),
                        cause.alias("unreadable"))


def read_records(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """The drain records of every input path that triage reads (:func:`read_lines` without the unreadable ones
    and without the ``unreadable`` column)."""
    return read_lines(spark, paths).where(F.col("unreadable").isNull()).drop("unreadable")


#: The triage columns, in the order they are written (``reason`` becomes the partition folder).
COLUMNS = ("meta_id", "reason", "poison", "urn", "original_queue", "queue_name", "dead_letter_queue", "lang",
           "dead_letter_lang", "schema_version", "trace_id", "data", "attempts", "exception", "exception_type",
           "error", "created_at", "failed_at", "age_ms", "source_broker", "source_conn_id", "delivery_count",
           "native_reason", "body", "body_encoding", "input_file", "error_pattern", "fingerprint", "drained_at",
           "copies")


#: Columns whose values are (nearly) all different: Parquet's dictionary encoding cannot shrink them and only
#: costs the writer a hash lookup per value until it gives up on each row group, so they are written plain.
PLAIN_COLUMNS = ("meta_id", "trace_id", "data", "error", "body", "created_at", "failed_at", "age_ms", "drained_at")


def parquet_options() -> dict[str, str]:
    """Writer options for the triage Parquet: dictionary encoding off for :data:`PLAIN_COLUMNS` (any Parquet
    reader reads the files as before; only the writer's work changes)."""
    return {f"parquet.enable.dictionary#{column}": "false" for column in PLAIN_COLUMNS}


def triage(records: DataFrame, source_broker: str | None = None) -> DataFrame:
    """Decode, classify, deduplicate and fingerprint drain records (see docs/spark.md for the columns)."""
    return derive(deduplicate(classify(records, source_broker)))


def classify(records: DataFrame, source_broker: str | None = None) -> DataFrame:
    """One row per drain record, decoded and classified (duplicates still in; see :func:`derive` for the
    columns computed from these).

    :param records: drain records as :func:`read_records` gives them.
    :param source_broker: a broker name to record instead of each record's own ``broker``.
    """
    # A utf-8 body is the text itself. A base64 body is decoded; its bytes are used only if they are UTF-8
    # (the drain writes base64 precisely when they are not, so it is normally poison).
    base64_body = F.coalesce(F.col("body_encoding") == "base64", F.lit(False))  # none: utf-8, as core.records
    decoded = F.when(base64_body, F.try_to_binary(F.col("body"), F.lit("base64")).cast("string"))
    utf8 = ~base64_body | (decoded.isNotNull() & F.is_valid_utf8(decoded))
    text = F.when(~base64_body, F.col("body")).when(utf8, decoded)
    df = records.select("*", utf8.alias("_utf8"), _parse_body(text).alias("_p"))
    # The columns in SQL text: one call to the JVM for all of them instead of one per column object. A wrapper
    # (core.peer) gives the reason of its block, poison when it has none; it is poison only for that reason.
    block_reason = _text_sql("_p.dead_letter.reason")
    wrapper_poison = f"{_WRAPPER_SQL} AND coalesce({block_reason}, '{Reason.POISON}') = '{Reason.POISON}'"
    poison = f"(_p.poison OR ({wrapper_poison}))"
    columns = {
        "meta_id": f"coalesce({_text_sql('_p.meta.id')}, {_text_sql('meta_id')})",
        "reason": f"CASE WHEN _p.poison THEN '{Reason.POISON}' WHEN {_WRAPPER_SQL} THEN "
                  f"coalesce({block_reason}, '{Reason.POISON}') ELSE coalesce({block_reason}, 'unannotated') END",
        "poison": poison,
        "urn": f"coalesce({_text_sql('_p.job')}, {_text_sql('_p.urn')})",
        "original_queue": f"coalesce({_text_sql('_p.dead_letter.original_queue')}, {_text_sql('_p.meta.queue')}, "
                          "queue_name)",
        "queue_name": "queue_name",
        "dead_letter_queue": "dead_letter_queue",
        "lang": _text_sql("_p.meta.lang"),
        "dead_letter_lang": _text_sql("_p.dead_letter.lang"),
        "schema_version": "_p.meta.schema_version",
        "trace_id": _text_sql("_p.trace_id"),
        "data": "_p.data",
        "attempts": "coalesce(_p.dead_letter.attempts, _p.attempts)",
        # (a poison wrapper's row keeps its block: the SDK's exception, error, failed_at, attempts, lang)
        "exception": _text_sql("_p.dead_letter.exception"),
        "error": f"CASE WHEN {wrapper_poison} THEN coalesce(_p.dead_letter.error, '{POISON_WRAPPED}') "
                 f"WHEN {_WRAPPER_SQL} THEN _p.dead_letter.error "
                 f"WHEN _p.poison THEN (CASE WHEN _p.framed THEN '{POISON_INVALID_FRAME}' "
                 f"WHEN _utf8 THEN '{POISON_INVALID_JSON}' ELSE '{POISON_INVALID_UTF8}' END) "
                 "ELSE _p.dead_letter.error END",
        "created_at": "_p.meta.created_at",
        "failed_at": "_p.dead_letter.failed_at",
        "source_broker": "broker",
    }
    rows = df.selectExpr(*[f"{sql} AS {name}" for name, sql in columns.items()], "source_conn_id", "delivery_count",
                         "native_reason", "drained_at", "body", "body_encoding", "input_file")
    # a name given on the command line is a value, never SQL text
    return rows.withColumn("source_broker", F.lit(source_broker)) if source_broker else rows


def deduplicate(df: DataFrame) -> DataFrame:
    """One row per dead letter, with ``copies``: how many drain records it had.

    At-least-once drains: one row per meta.id (poison and id-less bodies: per exact body), the earliest drained
    copy winning, ties broken by the rest of the row (nulls first), so the choice is deterministic. A window
    over one hash shuffle and one sort does it; an aggregate keeping the smallest row would sort twice (its
    buffer has strings, so Spark cannot hash-aggregate it).

    :param df: rows as :func:`classify` gives them; any column derived from these only may be left out (it
        would never break a tie) and added afterwards with :func:`derive`.
    """
    # The key is the meta.id itself (no prefix: the sort compares its first 8 bytes before anything else, and
    # those of an id vary most) with a flag telling ids from bodies; only bodies pay for a concatenation.
    by_id = F.col("meta_id").isNotNull() & ~F.col("poison")
    key = F.when(by_id, F.col("meta_id")).otherwise(
        F.concat(F.col("body_encoding"), F.lit(":"), F.sha2(F.col("body"), 256)))
    # The window in SQL text: one call to build instead of one per tie column (building the plan from Python
    # costs a round trip to the JVM per column object).
    ties = "".join(f", `{c}` ASC NULLS FIRST" for c in df.columns if c != "drained_at")
    spec = f"PARTITION BY _key, _by_id ORDER BY drained_at ASC NULLS FIRST{ties}"
    ranked = df.withColumns({"_key": key, "_by_id": by_id}).withColumns({
        "_rank": F.expr(f"row_number() OVER ({spec})"),
        "copies": F.expr(f"count(1) OVER ({spec} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)")})
    return ranked.where(F.col("_rank") == 1).drop("_key", "_by_id", "_rank")


def derive(df: DataFrame) -> DataFrame:
    """Add the derived columns (exception type, age, error pattern, fingerprint) and put the columns in
    :data:`COLUMNS` order. They are computed from other columns alone, so adding them after deduplication
    changes nothing but the cost: the shuffle carries fewer bytes and the error masking runs once per dead
    letter instead of once per drained copy.

    :param df: deduplicated rows (:func:`deduplicate`).
    """
    exception = F.col("exception")
    df = with_error_pattern(df, "error", "_masked")
    # A poison row's error of this job's own is its pattern as it is; a peer's error text (a poison wrapper's) is
    # masked like any other, so its variable parts (a character offset) do not split a group.
    own = F.col("poison") & F.col("error").isin(*sorted(OWN_POISON_ERRORS))
    pattern = F.when(own, F.col("error")).otherwise(F.col("_masked"))
    df = df.withColumns({"exception_type": short_exception(exception),
                         "age_ms": F.col("failed_at") - F.col("created_at"), "error_pattern": pattern})
    # core.fingerprint.error_fingerprint, as a Spark expression
    fingerprint = F.substring(F.sha2(F.concat_ws(FINGERPRINT_SEPARATOR, F.coalesce(exception, F.lit("")),
                                                 F.coalesce(F.col("error_pattern"), F.lit(""))), 256),
                              1, FINGERPRINT_CHARS)
    return df.withColumn("fingerprint", fingerprint).selectExpr(*COLUMNS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("BabelQueue dead-letter triage: drain records (JSON Lines) → partitioned Parquet")
    parser.add_argument("--source-broker", default=None,
                        help="record this broker name instead of each drain record's 'broker'")
    parser.add_argument("--report-output", default=None,
                        help="also write report.py's summary.json and report.html here, in the same Spark "
                             "application (saves a second start-up)")
    parser.add_argument("--carried-over", default="",
                        help="comma-separated names of input files drained by earlier runs whose triage did not "
                             "finish; the summary and the report say how many records came from them")
    parser.add_argument("--partitions", type=int, default=0,
                        help="output partitions before the write (0 = Spark's default)")
    args = parser.parse_args(argv)
    spark = get_spark(args.app_name or "babelqueue-triage")
    try:
        # the unreadable lines are counted as the write reads them (an observation: no second read of the input)
        observed = Observation("babelqueue-triage-lines")
        carried = sorted({name.strip() for name in args.carried_over.split(",") if name.strip()})
        all_lines = read_lines(spark, args.input)
        lines = all_lines.observe(
            observed, *[F.count_if(F.col("unreadable") == cause).alias(cause) for cause in UNREADABLE_CAUSES],
            F.count_if(_from_files(carried)).alias(_CARRIED))
        records = lines.where(F.col("unreadable").isNull()).drop("unreadable")
        rows = triage(records, args.source_broker)
        if args.partitions > 0:
            rows = rows.repartition(args.partitions, "reason")
        rows.write.mode("overwrite").options(**parquet_options()).partitionBy("reason").parquet(args.output)
        unreadable, carried_records = _line_counts(observed, all_lines, carried)
        carried_over = {"files": len(carried), "records": carried_records}
        written = spark.read.schema(rows.schema).parquet(args.output)
        if args.report_output:
            # the report counts rows and copies by reason anyway: its numbers save a job of our own
            from airflow_provider_babelqueue.spark.report import write_report

            report = write_report(spark, written, args.output, args.report_output, unreadable, carried_over)
            by_reason = report["by_reason"]
            records_read = report["totals"]["records"] - report["totals"]["unreadable"]
        else:
            counts = written.groupBy("reason").agg(F.count(F.lit(1)).alias("n"), F.sum("copies").alias("copies"))
            by_reason, records_read = {}, 0
            for row in sorted(counts.collect(), key=lambda r: r["reason"]):
                by_reason[row["reason"]] = row["n"]
                records_read += int(row["copies"])
        summary = run_summary(args.output, records_read, by_reason, unreadable) | {"carried_over": carried_over}
        if args.report_output:
            summary["report"] = join_url(args.report_output, "report.html")
        # Files whose names start with "_" are invisible to Parquet readers and to the replay-set reader.
        write_text(spark, join_url(args.output, "_triage_summary.json"), json.dumps(summary, indent=2) + "\n")
        if summary["unreadable"]:
            log_warning(spark, "babelqueue.triage", unreadable_warning(summary))
        print_summary(summary)
        return 0
    finally:
        stop_spark(spark)


_CARRIED = "carried_over"


def _from_files(names: Sequence[str]) -> Column:
    """True for a line read from one of the files ``names`` (file names, compared with the last segment of each
    line's ``input_file``, so a local path and its ``file:`` URL match alike)."""
    if not names:
        return F.lit(False)
    return F.element_at(F.split(F.col("input_file"), "/"), -1).isin(list(names))


def _line_counts(observed: Observation, lines: DataFrame, carried: Sequence[str]) -> tuple[dict[str, int], int]:
    """The unreadable lines per cause and the lines read from the ``carried`` files, as the write observed them.
    When it wrote nothing at all (every line unreadable), Spark may have no observation to give: then they are
    counted by a query of their own."""
    try:
        metrics = observed.get
    except Exception:  # noqa: BLE001 - py4j's error for "no metrics" (an assertion in the JVM)
        metrics = {}
    if all(name in metrics for name in (*UNREADABLE_CAUSES, _CARRIED)):
        return {cause: int(metrics[cause] or 0) for cause in UNREADABLE_CAUSES}, int(metrics[_CARRIED] or 0)
    counts: dict[str, int] = dict(lines.where(F.col("unreadable").isNotNull()).groupBy("unreadable").count().collect())
    carried_lines = lines.where(_from_files(carried)).count() if carried else 0
    return {cause: int(counts.get(cause, 0)) for cause in UNREADABLE_CAUSES}, carried_lines


def run_summary(output: str, records_read: int, by_reason: dict[str, int], unreadable: dict[str, int]
                ) -> dict[str, Any]:
    """Triage's summary: every input line is counted once, ``records = rows + duplicates_removed + unreadable``.

    :param output: the triage folder.
    :param records_read: the drain records triaged (the rows' copies).
    :param by_reason: rows per reason.
    :param unreadable: lines not triaged, per cause (:data:`UNREADABLE_CAUSES`).
    """
    rows_out, lost = sum(by_reason.values()), sum(unreadable.values())
    return {
        "job": "triage", "output": output, "records": records_read + lost, "rows": rows_out,
        "duplicates_removed": records_read - rows_out, "unreadable": lost,
        "unreadable_by_cause": {cause: unreadable.get(cause, 0) for cause in UNREADABLE_CAUSES},
        "poison": by_reason.get(str(Reason.POISON), 0), "by_reason": by_reason,
    }


def unreadable_warning(summary: dict[str, Any]) -> str:
    """The line the job writes to stderr (the task log) when it could not read some input lines."""
    causes = ", ".join(f"{cause} {count}" for cause, count in summary["unreadable_by_cause"].items() if count)
    return (f"{summary['unreadable']} of {summary['records']} input lines were not "
            f"triaged ({causes}); see unreadable_by_cause in {join_url(summary['output'], '_triage_summary.json')}")


if __name__ == "__main__":
    sys.exit(main())
