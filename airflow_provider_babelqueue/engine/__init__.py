"""The broker-agnostic engines over the binding protocol: consume, drain, replay, checks and limits. No Airflow."""
