# fleetloop — every entry point a developer or CI needs. `make test` is what .ci/run calls.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_SECONDS ?= 60

.PHONY: install demo test lint unit integration kafka kafka-up kafka-down schemas bench sim-table clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "fleetloop needs $(PYTHON) (Python >= 3.11) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetloop demo --seconds $(DEMO_SECONDS)

# Apache Kafka 4.x jars from Maven Central, cached under .cache/kafka (the embedded broker needs nothing).
kafka:
	scripts/kafka-fetch.sh

# One Apache Kafka on 127.0.0.1:$(KAFKA_PORT) in the background, KRaft, on the config the tests use
# (fleetloop/daemon/brokers/local.py); its data stays in $(KAFKA_DIR) across kafka-down / kafka-up.
KAFKA_PORT ?= 9092
KAFKA_DIR  ?= .cache/kafka-local
kafka-up: $(STAMP) kafka
	$(BIN)/python -m fleetloop.daemon.brokers.local up --port $(KAFKA_PORT) --dir $(KAFKA_DIR)

kafka-down: $(STAMP)
	$(BIN)/python -m fleetloop.daemon.brokers.local down --dir $(KAFKA_DIR)

lint: $(STAMP)
	$(BIN)/ruff check fleetloop tests
	$(BIN)/ruff format --check fleetloop tests
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q -m "not integration"

integration: $(STAMP) kafka
	$(BIN)/pytest -q -m integration

test: $(STAMP) kafka lint
	$(BIN)/pytest -q

schemas: $(STAMP)
	$(BIN)/python -m fleetloop.schemas.export

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
