# agentops: `make run` starts the whole product; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean proof

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

# The proofs (issue 13): short form (< 5 min, for CI) or `make proof FULL=1`. They need a
# PostgreSQL server (DATABASE_URL's; each proof makes a database of its own there).
proof: $(STAMP)
	$(BIN)/python -m proof $(if $(FULL),--full,) $(PROOFS)

clean:
	rm -rf $(VENV) var
