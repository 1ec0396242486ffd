# Developer entry points. `make test` and `make demo` work on a fresh machine (they create .venv first).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install jars test test-fast lint demo bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

jars: $(STAMP)
	$(BIN)/python -m spark_sb.session

# The whole suite (unit, local namespace, Spark; slow tests included).
test: jars
	$(BIN)/python -m pytest tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not spark and not slow"

lint: $(STAMP)
	$(BIN)/ruff check spark_sb tests jobs bench
	$(BIN)/ruff format --check spark_sb tests jobs bench
	$(BIN)/mypy spark_sb

demo: $(STAMP)
	$(BIN)/python jobs/demo.py

bench: $(STAMP)
	$(BIN)/python bench/bench_local_namespace.py
	$(BIN)/python bench/bench_paired_sender.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache spark-warehouse
