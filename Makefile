# Developer entry points. `make test` and `make demo` work on a fresh machine (they create .venv first).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JARS := $(VENV)/.delta-jars

# The pinned development set: the package with every extra, versions from constraints-dev.txt, and the local
# namespace (servicebus_local/, its own distribution, which the `local` extra names) editable beside it.
EXTRAS := spark,local,connect,test
CONSTRAINTS := constraints-dev.txt

# The oldest pair the `spark` extra admits (pyspark 4.0.5 + delta-spark 4.0.1, constraints-oldest.txt), in a
# venv of its own; `make test-spark-oldest` runs the Spark tier there (CI runs it beside `make test`).
OLDEST_VENV := .venv-oldest
OLDEST_CONSTRAINTS := constraints-oldest.txt
# The Spark tier: every test marked `spark` (tests/spark and the acceptance scenario, tests/conftest.py).
SPARK_TIER := tests/spark tests/acceptance
# Says which pair a run is on: pyspark, delta-spark and the Delta jar coordinates of the venv's Python.
SPARK_PAIR = import sys, pyspark, importlib.metadata as m; from spark_sb.spark.session import delta_packages; \
	print("== Spark pair:", "pyspark", pyspark.__version__, "+ delta-spark", m.version("delta-spark"), \
	"(jars", delta_packages() + ";", "venv", sys.prefix + ")", flush=True)

.PHONY: install jars test test-fast lint demo bench wheel clean test-azure jars-oldest test-spark-oldest

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

# The whole suite (unit, local namespace, Spark; slow tests included), and the local namespace's own tests.
test: jars
	@$(BIN)/python -c '$(SPARK_PAIR)'
	$(BIN)/python -m pytest tests servicebus_local/tests

# The Spark tier on the oldest pair: the same rules as above with VENV and CONSTRAINTS set (.venv-oldest has
# its own stamp and Delta jars step). `make jars-oldest` only builds .venv-oldest and fetches its Delta jars.
jars-oldest:
	@$(MAKE) --no-print-directory VENV=$(OLDEST_VENV) CONSTRAINTS=$(OLDEST_CONSTRAINTS) jars

test-spark-oldest: jars-oldest
	@$(OLDEST_VENV)/bin/python -c '$(SPARK_PAIR)'
	$(OLDEST_VENV)/bin/python -m pytest $(SPARK_TIER) -m spark

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests servicebus_local/tests -m "not spark and not slow and not packaging"

lint: $(STAMP)
	$(BIN)/ruff check spark_sb servicebus_local tests jobs bench harness
	$(BIN)/ruff format --check spark_sb servicebus_local tests jobs bench harness
	$(BIN)/mypy

demo: $(JARS)
	@$(BIN)/python jobs/demo.py

# The acceptance run against your own two namespaces (README "Try it on your own namespaces"): needs
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
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .mypy_cache .ruff_cache spark-warehouse build dist

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
