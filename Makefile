# Quire: `make run` starts the standalone cluster, `make test` runs everything CI runs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.quire-installed
RUN_STAMP := $(VENV)/.quire-run-installed
BENCH_STAMP := $(VENV)/.quire-bench-installed
DATA   ?= data
# `make run` variables: make run HUB_PORT=0 (any free port) BOOKIES=1 DATA=/tmp/q
HUB_PORT ?= 4080
BOOKIES  ?= 3
PROTOS := $(wildcard metastore/proto/*.proto bookie/proto/*.proto hub/proto/*.proto)

.PHONY: all setup system-deps bench-deps run test test-fast lint typecheck proto proto-check pytest bench-smoke clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

# Everything the tests use, in one uv run. uv's cache (~/.cache/uv) outlives a fresh clone: where it already
# holds every package (any machine that ran the suite before), `--offline` resolves and installs from it
# without asking the index (about 3 s, where pip asked the index for each of ~85 packages: one to five
# minutes of a clean clone's `make test`, by the network); else the same command runs online (a first run).
# uv itself comes from pip (one index request). The bench and plot extras are here too: the peer and plot
# tests run in `make test`.
UV := $(VENV)/bin/uv
TEST_INSTALL := -e '.[test,scan,bench,plot]' -e tests/plugin_example
$(STAMP): pyproject.toml tests/plugin_example/pyproject.toml | $(PY)
	$(PY) -m pip install -q 'uv>=0.5'
	$(UV) pip install -q --python $(PY) --offline $(TEST_INSTALL) 2>/dev/null || \
		{ echo "uv's cache lacks a package: installing from the index"; \
		  $(UV) pip install -q --python $(PY) $(TEST_INSTALL); }
	touch $@ $(BENCH_STAMP)

setup: $(STAMP)

# `make run` needs only the runtime dependencies: no test tools, no Spark.
$(RUN_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# Real components the tests need: Java 17 (on the machine) and Debian's ZooKeeper.
system-deps:
	@command -v java >/dev/null || { echo "java (17) is required but not installed" >&2; exit 1; }
	@if [ ! -e /usr/share/java/zookeeper.jar ]; then \
		echo "installing Debian zookeeper"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq zookeeper >/dev/null; \
	fi
	@test -e /usr/share/java/zookeeper.jar || { echo "zookeeper jars missing after install" >&2; exit 1; }
	@# the benchmark peers (tools/bench/peers.py); the peer tests run them, so CI installs them too
	@if ! command -v redis-server >/dev/null || ! command -v nats-server >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq; pkgs=redis-server; \
		if apt-cache policy nats-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then pkgs="$$pkgs nats-server"; \
		else echo "nats-server is not in this machine's Debian archive: benchmarks skip the NATS peer"; fi; \
		command -v redis-server >/dev/null && pkgs=$${pkgs#redis-server}; \
		if [ -n "$$(echo $$pkgs)" ]; then echo "installing Debian$$pkgs"; \
			DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$pkgs >/dev/null; fi; \
	fi
	@command -v redis-server >/dev/null || { echo "redis-server missing after install" >&2; exit 1; }
	@# the web console's browser tests (tests/hub/test_ui.py): Debian's chromium and its driver
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		echo "installing Debian chromium chromium-driver"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi
	@command -v chromedriver >/dev/null || { echo "chromedriver missing after install" >&2; exit 1; }

$(BENCH_STAMP): $(STAMP)
	@test -e $@ || $(PY) -m pip install -q -e '.[bench,plot]'
	touch $@

# Peers and clients for `quire bench publish|fanout`: Debian redis-server and nats-server, redis-py and nats-py;
# matplotlib for `quire bench ... --plot`.
bench-deps: system-deps $(BENCH_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/quire standalone --data $(DATA) --hub-port $(HUB_PORT) --bookies $(BOOKIES)

lint: setup
	$(VENV)/bin/ruff check .

# mypy sees the bench extra (redis, nats) so its stubs decide what is typed, same as on a dev machine.
# Its incremental cache lives outside the tree, so a fresh clone rechecks only what changed (mypy compares
# each module's content hash, whatever the clone's path): about 25 s of CPU saved per CI run.
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/quire-mypy
typecheck: setup $(BENCH_STAMP)
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE) metastore placement
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE) bookie hub tools

proto: setup
	@for f in $(PROTOS); do d=$$(dirname $$f); \
		$(PY) -m grpc_tools.protoc -I$$d --python_out=$$d --pyi_out=$$d $$f || exit 1; done

# Generated modules are committed; fail when they differ from a fresh generation.
proto-check: setup
	@tmp=$$(mktemp -d); status=0; \
	for f in $(PROTOS); do d=$$(dirname $$f); b=$$(basename $$f .proto); \
		$(PY) -m grpc_tools.protoc -I$$d --python_out=$$tmp --pyi_out=$$tmp $$f || status=1; \
		for ext in _pb2.py _pb2.pyi; do \
			cmp -s $$tmp/$$b$$ext $$d/$$b$$ext || { echo "stale generated file: $$d/$$b$$ext (run make proto)" >&2; status=1; }; \
		done; done; rm -rf $$tmp; exit $$status

# The whole suite on pytest-xdist workers. Most of its time waits on bookie, hub, ZooKeeper and Spark processes
# (a partition test uses a fifth of a core, a hub test's cluster less), so more workers than this machine's
# 2 cores (4 starved the RSS soak and the test bed's timing on a clean clone); each worker has its own
# ZooKeeper, ports and tmp dirs, and the
# tests of one module-scoped cluster stay on one worker (--dist loadgroup, tests/conftest.py). pytest exits
# non-zero on any failure and with 5 when no test ran. Extra options: make test PYTEST_ARGS='-x'.
# Byte code is cached even where the environment sets PYTHONDONTWRITEBYTECODE: the suite starts well over a
# thousand bookie, hub and `quire` processes, and each would compile Quire's modules again (and every pytest
# worker would rewrite every test module's asserts again); __pycache__ is git-ignored.
PYTEST_WORKERS ?= 3
PYTEST_ARGS ?=
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
pytest: setup system-deps bench-deps
	$(PYTEST) -q -ra -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The inner loop: unit and sans-IO tests only (no processes, ZooKeeper or Spark: tests/conftest.py marks
# every test that starts one `processes`, and here a test that starts one unmarked fails).
test-fast: setup
	$(PYTEST) -q -ra -n 2 -m "not processes and not slow" --forbid-processes $(PYTEST_ARGS)

test: setup system-deps lint typecheck proto-check pytest

bench-smoke: setup
	$(VENV)/bin/quire bench placement

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
