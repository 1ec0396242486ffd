# Developer entry points. `make test` and `make demo` work on a fresh machine (they create .venv first).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JARS := $(VENV)/.delta-jars

# The pinned development set: the package with every extra, versions from constraints-dev.txt, and the local
# namespace (servicebus_local/, its own distribution, which the `local` extra names) editable beside it. The oldest
# pair's venv leaves out `docs` (the site is built once, in .venv).
EXTRAS := spark,local,connect,test,docs
OLDEST_EXTRAS := spark,local,connect,test
CONSTRAINTS := constraints-dev.txt

# The oldest pair the `spark` extra admits (pyspark 4.0.5 + delta-spark 4.0.1, constraints-oldest.txt), in a
# venv of its own; `make test-spark-oldest` runs OLDEST_TIER there (CI runs it after the pinned pair's tiers).
OLDEST_VENV := .venv-oldest
OLDEST_CONSTRAINTS := constraints-oldest.txt

# The suite in tiers, one directory (or two) each, the tier marker coming from the directory (tests/conftest.py).
# `make test` runs them one after the other, as CI does (.ci/run, which prints each one's time). Every pytest run of
# a tier prints its 15 slowest tests.
PYTEST = $(BIN)/python -m pytest --durations=15
# pytest-xdist workers per tier (a tier's tests side by side in that many processes; 0: in pytest's own process).
# Measured on the 2-core machine: the integration tier used 99 s of CPU in 475 s (its tests wait on sockets,
# deadlines and lock expiry), the local namespace's likewise: 4 workers cut them to a third, the timing-sensitive
# tests inside their margins (6 did as well on a quiet machine, and missed bounds at a load of 8). Integration in 6
# (2026-12-07, a fresh machine, beside the local namespace's tier and the two JVM archives' training as CI runs it:
# 186 s in 4 workers, 131 and 128 s in 6, the machine 85% busy, every test passing). The Spark tier is
# CPU-bound (the JVMs): one worker per core, a file to a worker (--dist loadfile: the tests of a file that share one
# child process - a Connect server, a local cluster - run it once), the longest files first (tests/conftest.py's
# LONGEST_FIRST; --no-loadscope-reorder keeps that order: xdist's own gives out the files with the most tests
# first, and a 5-minute file started last on one worker leaves the other core idle). The benches pace themselves
# (tests/bench: three runs at a time).
UNIT_WORKERS ?= 2
PACKAGING_WORKERS ?= 2
SIM_WORKERS ?= 2
INTEGRATION_WORKERS ?= 6
SERVICEBUS_LOCAL_WORKERS ?= 4
SPARK_WORKERS ?= 2
# The oldest pair's Spark tier: as many; CI runs it beside the pinned pair's in one worker (.ci/run).
OLDEST_WORKERS ?= 2
UNIT_TIER := tests/unit
# The simulation of ordering and the ledger (issue 47, SPEC O9): 2,000 seeded schedules in 8 chunks, in pytest
# processes of their own - it swaps the process-level pools and registries of the code under test per simulated
# worker, and run after the unit tests in one process a chunk once took 300 s instead of 6 (state left by them).
SIM_TIER := tests/sim
# Wheels built and installed into fresh venvs by pip, the CI and Makefile rules read as text: a tier of its own.
PACKAGING_TIER := tests/packaging
INTEGRATION_TIER := tests/integration
SERVICEBUS_LOCAL_TIER := servicebus_local/tests
# The Spark tier: every test marked `spark` (tests/spark and the acceptance scenario).
SPARK_TIER := tests/spark tests/acceptance
# Every bench/bench_*.py in its smoke mode (tests/bench, marker `bench`): no bench rots.
BENCH_TIER := tests/bench
# What the oldest pair runs: the tests whose outcome depends on the pyspark / delta-spark versions - Spark
# Connect (sink, syphon, data source), the data source (format("servicebus"): Spark's Python data source API, and
# with ordering its plan and commit, read in two writer objects per micro-batch),
# Delta itself and the Delta state store (path and catalog tables, maintained), the foreachBatch sink, and the
# syphon job's Spark parts (its query, Trigger.AvailableNow). The rest of the Spark tier drives our own logic
# through Spark (the sink's state rows and replays - the store's Delta calls are test_state_delta's -, executor
# hand-off, shutdown, a blackholed primary, ordering, the syphon's command line and SIGTERM, the dashboard's
# notebook, the acceptance scenario): it runs on the pinned pair only.
# The packaging tier checks that every file listed here exists.
OLDEST_TIER := \
	tests/spark/test_connect.py \
	tests/spark/test_source_connect.py \
	tests/spark/test_datasource.py \
	tests/spark/test_datasource_catalog.py \
	tests/spark/test_datasource_ordering.py \
	tests/spark/test_delta_harness.py \
	tests/spark/test_state_delta.py \
	tests/spark/test_state_maintenance.py \
	tests/spark/test_sink.py \
	tests/spark/test_syphon_job.py \
	tests/spark/test_syphon_job_available_now.py \
	tests/spark/test_quiet_start.py
# Within those files, the tests the oldest pair skips: they run statements another test of the same file runs
# there too (the path store's contract tests whose catalog twin runs, and its own test of path tables - their
# creation and a repeated commit skipped, which the sink's and data source's tests meet there on their path tables
# and the catalog twin's replay test by transaction id -, the data source's batch write with catalog tables beside its stream and
# test_datasource's batch write, maintenance on tables grown by 3,000 batches - 118 s there; the same statements
# run on small tables in test_maintain_runs_each_statement_on_small_tables), or drive our own logic only (the
# syphon planner's hints, a missing entity's event, Premium rows sent alone). The packaging tier checks that each
# names a test.
OLDEST_DESELECT := \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_empty_store_reads_nothing \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_batch_rows_round_trip \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_repeated_or_older_batch_is_written_once \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_pulled_queues_round_trip \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_entities_version_moves_with_entity_writes_only \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_append_events_outside_batches \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_a_group_commit_is_one_write_per_table_and_skipped_when_retried \
	tests/spark/test_state_delta.py::TestDeltaPathStore::test_tables_are_delta_path_tables_with_idempotent_commits \
	tests/spark/test_state_maintenance.py::test_maintain_keeps_the_tables_small_and_what_sinks_need \
	tests/spark/test_datasource_catalog.py::test_a_batch_write_with_catalog_tables_needs_a_spool_and_is_relayed_under_its_job_id \
	tests/spark/test_syphon_job.py::test_the_planner_reads_entity_states_written_by_the_store_as_hints \
	tests/spark/test_syphon_job.py::test_a_message_for_an_entity_that_does_not_exist_becomes_an_event_and_shows_in_status \
	tests/spark/test_sink.py::test_premium_large_rows_go_alone_healthy_diverted_and_moved_back
# The tests the pinned pair skips: written for the oldest pair, in place of a longer test of the same file that
# runs their statements on the pinned pair (maintenance on small tables: the grown tables' test runs them). The
# packaging tier checks that each names a test.
SPARK_DESELECT := \
	tests/spark/test_state_maintenance.py::test_maintain_runs_each_statement_on_small_tables
# Says which pair a run is on: pyspark, delta-spark and the Delta jar coordinates of the venv's Python.
SPARK_PAIR = import sys, pyspark, importlib.metadata as m; from spark_sb.spark.session import delta_packages; \
	print("== Spark pair:", "pyspark", pyspark.__version__, "+ delta-spark", m.version("delta-spark"), \
	"(jars", delta_packages() + ";", "venv", sys.prefix + ")", flush=True)

.PHONY: install jars jvm-archive jvm-archive-oldest test test-fast lint docs demo bench wheel clean test-azure \
	jars-oldest test-spark-oldest test-unit test-sim test-packaging test-integration test-servicebus-local \
	test-spark bench-smoke simulate

$(STAMP): pyproject.toml servicebus_local/pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ./servicebus_local -e '.[$(EXTRAS)]' -c $(CONSTRAINTS)
	touch $(STAMP)

install: $(STAMP)

# The Delta Lake jars: resolved once from Maven Central into the Ivy cache (its report goes to a log, shown only
# on failure); sessions started afterwards use the recorded jar files and print no resolver output.
$(JARS): $(STAMP)
	@echo "fetching the Delta Lake jars (once; log: $(JARS).log)"
	@$(BIN)/python -m spark_sb.spark.session > $(JARS).log 2>&1 || { cat $(JARS).log; exit 1; }
	@touch $(JARS)

jars: $(JARS)

# The class-data archive every JVM of the test suite maps (tests/jvm_archive.py; tests/conftest.py passes it):
# Spark's and Delta's classes parsed and verified once, not in each of the Spark tier's dozens of JVMs. Built once
# per venv from its jars (about a minute); the suite runs without it too, slower.
CDS := $(VENV)/spark-cds.jsa
$(CDS): $(JARS) tests/jvm_archive.py
	@$(BIN)/python -m tests.jvm_archive $(CDS)

jvm-archive: $(CDS)

# The whole suite (unit, packaging, integration, the local namespace's own tests, Spark, the benches' smoke runs;
# slow tests included): every tier below, one after the other (the first that fails stops it; CI runs them all).
test: jars
	@$(BIN)/python -c '$(SPARK_PAIR)'
	@$(MAKE) --no-print-directory test-unit test-sim test-packaging test-integration test-servicebus-local test-spark bench-smoke

# One tier each (CI runs them in turn; together they are `make test`).
test-unit: $(STAMP)
	$(PYTEST) -n $(UNIT_WORKERS) $(UNIT_TIER)

test-sim: $(STAMP)
	$(PYTEST) -n $(SIM_WORKERS) $(SIM_TIER)

test-packaging: $(STAMP)
	$(PYTEST) -n $(PACKAGING_WORKERS) $(PACKAGING_TIER)

test-integration: $(STAMP)
	$(PYTEST) -n $(INTEGRATION_WORKERS) $(INTEGRATION_TIER)

test-servicebus-local: $(STAMP)
	$(PYTEST) -n $(SERVICEBUS_LOCAL_WORKERS) $(SERVICEBUS_LOCAL_TIER)

test-spark: jars jvm-archive
	@$(BIN)/python -c '$(SPARK_PAIR)'
	$(PYTEST) -n $(SPARK_WORKERS) --dist loadfile --no-loadscope-reorder $(addprefix --deselect ,$(SPARK_DESELECT)) $(SPARK_TIER)

# Every benchmark in its smoke mode (seconds each; the Spark ones about a minute): it runs and prints its figures.
# -rP: each run's own time ("bench_x.py --smoke: 12.3 s"; the tests' durations include waiting for a free job).
bench-smoke: jars
	$(PYTEST) -rP $(BENCH_TIER)

# The version-sensitive part of the Spark tier (OLDEST_TIER) on the oldest pair: the same rules as above with VENV
# and CONSTRAINTS set (.venv-oldest has its own stamp and Delta jars step). `make jars-oldest` only builds
# .venv-oldest and fetches its Delta jars.
jars-oldest:
	@$(MAKE) --no-print-directory EXTRAS=$(OLDEST_EXTRAS) VENV=$(OLDEST_VENV) CONSTRAINTS=$(OLDEST_CONSTRAINTS) jars

jvm-archive-oldest: jars-oldest
	@$(MAKE) --no-print-directory EXTRAS=$(OLDEST_EXTRAS) VENV=$(OLDEST_VENV) CONSTRAINTS=$(OLDEST_CONSTRAINTS) \
		jvm-archive

test-spark-oldest: jars-oldest
	@$(MAKE) --no-print-directory jvm-archive-oldest
	@$(OLDEST_VENV)/bin/python -c '$(SPARK_PAIR)'
	$(OLDEST_VENV)/bin/python -m pytest --durations=15 -n $(OLDEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		$(addprefix --deselect ,$(OLDEST_DESELECT)) $(OLDEST_TIER)

# The ordering simulation (tests/sim, SPEC O9) on demand: N schedules (the unit tier runs 2,000); SIM_SEED=<n>
# replays one, SIM_FIRST=<n> starts elsewhere.
N ?= 20000
simulate: $(STAMP)
	SIM_SCHEDULES=$(N) $(PYTEST) -n $(UNIT_WORKERS) tests/sim -k every_schedule

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(INTEGRATION_WORKERS) tests servicebus_local/tests \
		-m "not spark and not slow and not packaging and not bench"

lint: $(STAMP)
	$(BIN)/ruff check spark_sb servicebus_local tests jobs bench harness
	$(BIN)/ruff format --check spark_sb servicebus_local tests jobs bench harness
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/): docs/configuration.md written again from the configuration model
# (docs/gen_config_reference.py; tests/unit/test_docs.py fails when the committed page differs), then built with
# --strict (a broken link, a page missing from the nav or an API name that does not resolve fails it) into site/.
docs: $(STAMP)
	$(BIN)/python docs/gen_config_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

demo: $(JARS)
	@$(BIN)/python jobs/demo.py

# The acceptance run against your own two namespaces (docs/azure.md, "Try it on your own namespaces"): needs
# SB_PRIMARY_CONNECTION_STRING and SB_SECONDARY_CONNECTION_STRING (or SB_PRIMARY_FQDN / SB_SECONDARY_FQDN);
# without them it says what to set and exits 2. ARGS="--keep" leaves what it created.
test-azure: $(JARS)
	@$(BIN)/python -m tests.acceptance $(ARGS)

# The wheel to install on Databricks or anywhere else (dist/spark_servicebus-<version>-py3-none-any.whl), and the
# local namespace's own (dist/servicebus_local-<version>-py3-none-any.whl).
wheel: $(STAMP)
	rm -rf build servicebus_local/build dist/spark_servicebus-*.whl dist/servicebus_local-*.whl
	$(BIN)/pip wheel -q --no-deps -w dist . ./servicebus_local
	rm -rf build servicebus_local/build
	@ls dist/spark_servicebus-*.whl dist/servicebus_local-*.whl

bench: $(STAMP)
	$(BIN)/python bench/bench_local_namespace.py
	$(BIN)/python bench/bench_paired_sender.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .mypy_cache .ruff_cache spark-warehouse build dist site

# Two local namespaces in the background for the README's examples: primary (queue orders) on 5672 and secondary
# on 5682, one CA in ~/.cache/spark-sb-tls, the backlog queues of conf/local.yaml provisioned; prints the variables
# the examples read as export lines: eval "$(make -s local-namespaces)". Logs and pid files in /tmp/spark-sb-local
# (jobs/local_namespaces.py); `make local-namespaces-stop` stops them.
LOCAL_NS_DIR ?= /tmp/spark-sb-local
LOCAL_NS_TLS_DIR ?= $(HOME)/.cache/spark-sb-tls
LOCAL_NS_PORTS ?= 5672 5682
.PHONY: local-namespaces local-namespaces-stop

# (the venv is made when missing, never remade here: starting the namespaces installs nothing into a venv in use)
local-namespaces:
	@test -f $(STAMP) || $(MAKE) --no-print-directory install >&2
	@$(BIN)/python jobs/local_namespaces.py start --dir '$(LOCAL_NS_DIR)' --tls-dir '$(LOCAL_NS_TLS_DIR)' \
		--ports $(LOCAL_NS_PORTS)

local-namespaces-stop:
	@$(BIN)/python jobs/local_namespaces.py stop --dir '$(LOCAL_NS_DIR)'
