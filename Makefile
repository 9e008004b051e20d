# nicfleet — the two commands a newcomer needs are `make demo` and `make test`;
# both install everything themselves (a .venv in the repo root, pinned versions).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PY_DIRS := agent aggregator proto tests $(wildcard bench)

.PHONY: install system-packages demo test test-faults lint typecheck contracts unit stubs bench clean docs-cli docs-api

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "nicfleet needs Python >= 3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing nicfleet and its pinned dependencies into $(VENV) (a few minutes the first time)..."
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

# Debian packages some tests use for real; the tests that need one skip without it.
#   python3-pyverbs         the verbs probe against the real rdma-core library
#   prometheus              promtool lints the agent's and the aggregator's /metrics
#   prometheus-alertmanager a real Alertmanager receives the aggregator's alerts
#   strace                  catches filesystem writes the agent does in C (gRPC)
#   chromium                the status page's headless-browser test
# Installed with apt-get only when running as root; skip with `make test NICFLEET_NO_APT=1`.
SYSTEM_PACKAGES := python3-pyverbs prometheus-alertmanager prometheus strace chromium
system-packages:
	@if [ -n "$(NICFLEET_NO_APT)" ]; then echo "NICFLEET_NO_APT set: not installing Debian packages ($(SYSTEM_PACKAGES)); the tests that need them skip"; \
	elif [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then \
			echo "installing Debian packages:$$missing (see the Makefile's system-packages for why each; skip with NICFLEET_NO_APT=1)"; \
			{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; } \
				|| echo "warning: could not install$$missing; the tests that need them will skip"; \
		else echo "Debian packages for the real-tool tests already installed: $(SYSTEM_PACKAGES)"; fi; \
	else echo "not root: Debian packages $(SYSTEM_PACKAGES) not installed; the tests that need them skip"; \
	fi

demo: install
	$(BIN)/nicfleetctl demo

lint: install
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)

typecheck: install
	$(BIN)/mypy

contracts: install
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest -q -m "not slow"

# Fault tests (kill servers and processes); `make test` runs them too when CI is set.
test-faults: install
	$(BIN)/pytest -q -m slow

test: install system-packages lint typecheck contracts unit $(if $(CI),test-faults)

# Benchmarks (never part of `make test`): numbers go to docs/performance.md.
bench: install
	$(BIN)/python bench/agent_collect.py --install --runs 21 --paced 20
	$(BIN)/python bench/deviceplugin_latency.py

stubs: install
	$(BIN)/python proto/stubgen.py

# docs/cli-reference.md from the click command trees (a unit test fails when it is stale).
docs-cli: install
	$(BIN)/python docs/gen_cli_reference.py

# docs/api-reference.md from the served OpenAPI document (a unit test fails when it is stale).
docs-api: install
	$(BIN)/python docs/gen_api_reference.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
