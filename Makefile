# fleetloop — every entry point a developer or CI needs. .ci/run calls `make test` and `make test-system`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_SECONDS ?= 60

# The tests come in two tiers (README, "Development"; tests/conftest.py):
#   make test         lint, unit tests and the integration core on both brokers (every test not
#                     marked `system`; a new test lands here unless marked);
#   make test-system  the long forms, marked `system`: soak, fuzz, restarts, benches, the browser,
#                     the simulator tables against their committed rows.
# Both run on PYTEST_WORKERS processes (pytest-xdist); each broker's tests stay on one worker
# (--dist loadgroup), so each broker starts once. PYTEST_ARGS adds options, e.g. --durations=25.
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
PYTEST := $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

.PHONY: install demo test test-system lint unit integration kafka kafka-up kafka-down schemas bench-results clean

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

# Parts of `make test`: the tests that need no broker, and the integration core.
unit: $(STAMP)
	$(PYTEST) -m "not integration and not system"

integration: $(STAMP) kafka
	$(PYTEST) -m "integration and not system"

test: $(STAMP) kafka lint
	$(PYTEST) -m "not system"

test-system: $(STAMP) kafka
	$(PYTEST) -m system

schemas: $(STAMP)
	$(BIN)/python -m fleetloop.schemas.export

# Every committed result in bench/results made again, one process at a time (bench/README.md):
# hours, since it runs the simulator's tables and real-time benches with brokers.
bench-results: $(STAMP) kafka
	$(BIN)/fleetloop bench results

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
