"""The pure envelope core: the envelope, the drain-record format, the exception tree, idempotency and payload
schemas. Standard library, orjson and (for payload schemas) jsonschema only: no Airflow, no broker client."""
