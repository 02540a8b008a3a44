# agentops: `make run` starts the whole product; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m agentops.run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy .

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/python -m agentops.embedded_redis -- $(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
