"""What the provider tells a platform team: metrics through Airflow's metrics client (:mod:`.metrics`) and
OpenTelemetry spans (:mod:`.tracing`). docs/observability.md has the names."""
