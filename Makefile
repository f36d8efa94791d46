# Toolkeeper: `make run` starts the embedded default, `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test install lint migrate run-distributed worker beat bench clean

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

test: install
	$(BIN)/python -m pytest -n auto

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python bench/call_overhead.py

clean:
	rm -rf $(VENV) var
