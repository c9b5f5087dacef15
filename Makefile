# The two commands: `make demo` and `make test`. Everything else is a helper they use.
.PHONY: demo verdicts docs test bench bench-consume bench-trigger bench-console bench-body-limit crash-consume crash-trigger hostile-corpus bootstrap services lock lint typecheck spark-class-archive install-check clean

CONFORMANCE ?= ../shared/conformance

demo:
	bash .ci/demo.sh

# The envelope core's verdicts on the public conformance fixtures (no Airflow, no broker).
verdicts: bootstrap
	.venv/bin/python -m airflow_provider_babelqueue.core.verdicts $(CONFORMANCE)

test:
	bash .ci/test.sh

# The documentation site, strict: a broken link, anchor or include fails the build.
docs: bootstrap
	.venv/bin/mkdocs build --strict

# The optional Spark driver class archive (docs/spark.md): one training run of the triage job on a local master.
spark-class-archive: bootstrap
	.venv/bin/python -m airflow_provider_babelqueue.spark.class_archive $${BABELQUEUE_SPARK_CLASS_ARCHIVE:-$$HOME/.cache/babelqueue/spark-driver.jsa}

bench: bootstrap
	.venv/bin/python benchmarks/run.py

# Batched consumption against each raw client's reliable batched loop, same run (docs/benchmarks.md); N=100000.
bench-consume: bootstrap services
	.venv/bin/python benchmarks/bench_consume.py --n $${N:-100000}

# Events per second from one message trigger against the consumer, same run, then publish -> DAG run start on a real
# local Airflow (docs/benchmarks.md); N=5000 messages per measurement, M=50 per broker published 1 s apart.
bench-trigger: bootstrap services
	.venv/bin/python benchmarks/bench_message_trigger.py --n $${N:-5000} --m $${M:-50}

# Dead-letter console page latency (browse_page and its HTTP route) on a DLQ of N=1000000 per broker: Redis, SQLite,
# PostgreSQL (docs/benchmarks.md); BROKERS and PAGES (samples per measurement, 20) narrow or widen it.
bench-console: bootstrap services
	.venv/bin/python benchmarks/bench_console_browse.py --n $${N:-1000000} --brokers $${BROKERS:-redis,sqlite,postgresql} \
		--pages $${PAGES:-20}

# kill -9 the batched consumer 20 times per broker (CI runs 4): 0 lost, at most one batch repeated per kill.
crash-consume: bootstrap services
	BQ_CRASH_KILLS=$${KILLS:-20} .venv/bin/python -m pytest -p no:cacheprovider -s tests/reliability/test_crashes.py -k consume

# SIGKILL the triggerer 20 times while 1,000 messages per broker arrive (CI: 100 and 3): 0 lost, duplicates counted.
crash-trigger: bootstrap services
	BQ_TRIGGER_MESSAGES=$${MESSAGES:-1000} BQ_TRIGGER_KILLS=$${KILLS:-20} .venv/bin/python -m pytest -p no:cacheprovider \
		-s tests/sensors/test_e2e_message_trigger.py

# Peak memory of refusing one oversized body, per binding (docs/benchmarks.md); BODY_MB=100 by default.
bench-body-limit: bootstrap
	.venv/bin/python benchmarks/bench_body_limit.py --mb $${BODY_MB:-100}

# The hostile-input corpus through consume, DLQ, drain, triage, report and redrive on SQLite, PostgreSQL, Redis and
# RabbitMQ (tests/reliability/test_hostile_corpus.py); BIG_MB sizes the oversized body (20 by default, as in CI).
hostile-corpus: bootstrap services
	BQ_HOSTILE_BIG_MB=$${BIG_MB:-20} .venv/bin/python -m pytest -p no:cacheprovider tests/reliability/test_hostile_corpus.py

# The wheel installed as users install it (plain pip, the spark extra, a fresh venv per Python), checked and run
# (tests/install): PYTHONS="3.11 3.12 3.13" checks each in turn, python3.11 alone by default.
PYTHONS ?= 3.11
install-check: bootstrap
	@failed=""; for version in $(PYTHONS); do \
		echo "install-check: python$$version"; \
		BABELQUEUE_INSTALL_PYTHON=python$$version .venv/bin/python -m pytest -p no:cacheprovider -q \
			--durations=3 tests/install || failed="$$failed $$version"; \
	done; \
	if [ -n "$$failed" ]; then echo "install-check: failed on Python$$failed" >&2; exit 1; fi

bootstrap:
	bash .ci/bootstrap.sh

services:
	bash .ci/services.sh

lint: bootstrap
	.venv/bin/ruff check airflow_provider_babelqueue tests benchmarks dags tools

# mypy over the package; configuration in pyproject.toml (strict on core/ and bindings/base).
typecheck: bootstrap
	.venv/bin/mypy

# Re-pin requirements/ci.lock after changing dependencies in pyproject.toml.
lock: bootstrap
	.venv/bin/uv pip compile pyproject.toml --extra all --group test --python-version 3.11 \
		-o requirements/ci.lock

clean:
	rm -rf .venv .demo .pytest_cache .hypothesis .ruff_cache
