# agentops: `make run` starts the whole product; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean proof bench-peers

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
	$(BIN)/python -m agentops.embedded_redis -- $(BIN)/pytest --ignore=$(MULTI_HOST) $(PYTEST_ARGS)
	$(BIN)/python -m agentops.embedded_redis -- $(BIN)/pytest $(MULTI_HOST)

# The two-host tests start their own engine, gateway and host workers on the suite's broker; in the
# same pytest process as the session-scoped worker and gateway (which consume the same queues) they
# time out, so they run in a pytest process of their own (the interference is an open issue: #16).
MULTI_HOST := tests/hosts_app/test_multi_host.py

# The proofs (issue 13): short form (< 5 min, for CI) or `make proof FULL=1`. They need a
# PostgreSQL server (DATABASE_URL's; each proof makes a database of its own there).
proof: $(STAMP)
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
