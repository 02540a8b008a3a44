# agentops: `make run` starts the whole product; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-full lint install bytecode clean proof bench-peers

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The project's bytecode, written up front: with PYTHONDONTWRITEBYTECODE set (this machine's
# environment sets it) every process compiled the project's sources again at start, ~0.4 s of CPU
# each, and the suite starts ~150. Up-to-date files are skipped; __pycache__ is not in git.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -x '/\.(venv|git)' . >/dev/null

run: $(STAMP) bytecode
	$(BIN)/python -m agentops.run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy .

# The suite runs in PYTEST_WORKERS pytest-xdist processes (each with its own test database, Redis
# database, workspace roots and scripted model: tests/conftest.py); most tests wait on workers,
# daphne or the browser, so more processes than cores pay. `make test PYTEST_WORKERS=0` runs it in
# one process; PYTEST_ARGS adds arguments (e.g. a path, -x).
# The long proofs (the schemathesis fuzz, the 25,000-event WebSocket and SSE backlogs) run a short form
# here, for CI: the same real processes and assertions on less data. `make test FULL=1` (or
# `make test-full`; AGENTOPS_TEST_FULL=1 for pytest) runs them in full.
PYTEST_WORKERS ?= 3
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal)

test: $(STAMP) bytecode
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(if $(FULL),AGENTOPS_TEST_FULL=1 ,)$(BIN)/python -m agentops.embedded_redis -- $(BIN)/pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

test-full:
	$(MAKE) test FULL=1

# The proofs (issue 13): short form (< 5 min, for CI) or `make proof FULL=1`. They need a
# PostgreSQL server (DATABASE_URL's; each proof makes a database of its own there).
proof: $(STAMP) bytecode
	$(BIN)/python -m proof $(if $(FULL),--full,) $(PROOFS)

# agentops beside LangGraph, DBOS and the OpenAI Agents SDK on the same work and database (issue 13).
# The peers get their own virtualenv from bench/peers-requirements.txt; DATABASE_URL names the
# database (default postgres://postgres@127.0.0.1:5432/bench_peers). PEERS_ARGS: e.g. --rounds 5 --ns 200.
PEERS_VENV := bench/.venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): bench/peers-requirements.txt
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers-requirements.txt
	touch $(PEERS_STAMP)

bench-peers: $(STAMP) $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python bench/peers.py $(PEERS_ARGS)

clean:
	rm -rf $(VENV) var $(PEERS_VENV)
