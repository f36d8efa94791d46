# Toolkeeper: `make run` starts the embedded default, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test install lint migrate serve worker beat bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

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
	$(BIN)/celery -A toolkeeper worker --loglevel=info

beat: install
	$(BIN)/celery -A toolkeeper beat --loglevel=info --schedule $${TOOLKEEPER_DATA_DIR:-var}/celerybeat-schedule

test: install
	$(BIN)/python -m pytest -n auto --dist loadgroup

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# BENCH_ARGS=--quick for a run well under a minute.
bench: install
	$(BIN)/python bench/call_overhead.py --json bench/results/call_overhead.json $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var
