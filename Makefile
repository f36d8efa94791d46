# Toolkeeper: `make run` starts the embedded default, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
SERVERS ?= 2
STAMP := $(VENV)/.installed
# The MCP interop tests' node packages (the official conformance suite, the TypeScript SDK client).
NODE_DIR := tests/mcp/conformance
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
# The accessibility checker of the browser tests (axe-core).
A11Y_DIR := tests/a11y
A11Y_STAMP := $(A11Y_DIR)/node_modules/.installed
# The OpenID provider of the single sign-on tests (oidc-provider).
IDENTITY_DIR := tests/identity
IDENTITY_STAMP := $(IDENTITY_DIR)/node_modules/.installed

.PHONY: run test install install-node lint migrate serve worker beat cluster bench mutate coverage clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Without npm the step only says so: those tests skip (fail with TOOLKEEPER_REQUIRE_SERVICES=1).
$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "npm is not installed: the MCP conformance and TypeScript interop tests will not run"; \
	fi

$(A11Y_STAMP): $(A11Y_DIR)/package.json $(A11Y_DIR)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(A11Y_DIR) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "npm is not installed: the accessibility checks of the browser tests will not run"; \
	fi

$(IDENTITY_STAMP): $(IDENTITY_DIR)/package.json $(IDENTITY_DIR)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(IDENTITY_DIR) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else \
		echo "npm is not installed: the single sign-on tests will not run"; \
	fi

install-node: $(NODE_STAMP) $(A11Y_STAMP) $(IDENTITY_STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

run: migrate
	$(BIN)/python manage.py bootstrap --url http://$(HOST):$(PORT)
	$(BIN)/daphne -b $(HOST) -p $(PORT) toolkeeper.asgi:application

# Distributed mode: set DATABASE_URL, REDIS_URL and TOOLKEEPER_EXECUTOR=celery, then run each of
# these (in its own terminal or service unit; several `serve` and `worker` processes may run).
serve: migrate
	$(BIN)/daphne -b $(HOST) -p $(PORT) toolkeeper.asgi:application

worker: install
	$(BIN)/celery -A toolkeeper worker --loglevel=info --without-gossip --without-mingle --without-heartbeat  # tools.calls.runtime.WORKER_OPTIONS

beat: install
	$(BIN)/celery -A toolkeeper beat --loglevel=info --schedule $${TOOLKEEPER_DATA_DIR:-var}/celerybeat-schedule

# Or all of them on this host with one command: $(SERVERS) daphne processes sharing one socket on
# $(HOST):$(PORT), a Celery worker and beat; Ctrl-C stops them all.
cluster: migrate
	$(BIN)/python manage.py serve_cluster --host $(HOST) --port $(PORT) --servers $(SERVERS)

test: install install-node
	$(BIN)/python -m pytest -n auto --dist loadgroup

# The mutation score of the guard modules ([tool.mutmut] in pyproject.toml): not part of `make test`,
# a full run takes hours on two cores. Needs PostgreSQL. Verdicts are kept in var/mutation/ and recorded in
# tests/mutation_record/ when the run ends or is interrupted (Ctrl-C), so a run in a new checkout goes on
# where the last stopped; only the mutants of changed functions are tried again, and MUTANTS='<names or
# globs>' tries those (after new tests). `rm -rf var/mutation tests/mutation_record` starts over.
MUTATE_STAMP := $(VENV)/.installed-mutate
$(MUTATE_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev,mutate]"
	touch $(MUTATE_STAMP)

mutate: $(MUTATE_STAMP)
	$(BIN)/python tests/mutation.py prepare
	trap : INT; cd var/mutation && $(CURDIR)/$(BIN)/mutmut run $(MUTANTS); \
		status=$$?; cd $(CURDIR) && $(BIN)/python tests/mutation.py record && exit $$status
	$(BIN)/python tests/mutation.py report

# Which lines of the source the suite runs: a table per module and the total (the suite as `make test`).
COVER_STAMP := $(VENV)/.installed-coverage
$(COVER_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev,coverage]"
	touch $(COVER_STAMP)

coverage: $(COVER_STAMP) install-node
	$(BIN)/python -m pytest -n auto --dist loadgroup --cov --cov-report=term -m "not stops_threads"

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# BENCH_ARGS=--quick for a run well under a minute.
bench: install
	$(BIN)/python bench/call_overhead.py --json bench/results/call_overhead.json $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var $(NODE_DIR)/node_modules $(A11Y_DIR)/node_modules
