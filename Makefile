# Two commands matter: `make run` (install everything, run the bundled tasks) and `make test`.
# Both are quick no-ops for the parts that are already installed.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
APT_PKGS := chromium chromium-headless-shell libturbojpeg0-dev cmake gcc
SOURCES := pyproject.toml CMakeLists.txt $(wildcard engine/_imgcodec/*.c engine/_imgcodec/*.h engine/_filewrite/*.c)
# The editable install maps each module to its file: a module added, moved or removed (its folder's time changes)
# needs a new map, which a reinstall makes in seconds.
PACKAGE_DIRS := $(shell find $(addprefix $(CURDIR)/,cli engine browserpool policy train tui bench viewer server) -type d \
                  -not -name __pycache__ -not -path '*/sites/*' 2>/dev/null)

.PHONY: run test setup system lint bench clean

run: setup
	$(VENV)/bin/webgym-engine run

# The one-way import rule and the type check first (both configured in pyproject.toml; docs/architecture.md), then
# the tests: in
# TEST_PROCS processes (a test waits on its browsers much of the time), each file's tests in one process (its
# module fixtures start once); the tests that assert an upper bound on elapsed time after them, alone.
# TEST_REPORT=PREFIX writes each phase's JUnit report to PREFIX-PHASE.xml (`python -m bench.test_time` reads them).
TEST_PROCS ?= 2
TEST_REPORT ?=
junit = $(if $(TEST_REPORT),--junitxml=$(TEST_REPORT)-$(1).xml)
test: setup
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist loadfile -m "not wallclock" $(call junit,parallel)
	$(PY) -m pytest -q -m wallclock $(call junit,wallclock)

setup: system $(STAMP)

# Debian packages: Chromium's headless shell that the workers run, the full Chromium (`--chromium`; Playwright
# cannot download its own browsers here) and libjpeg-turbo.
system:
	@dpkg -s $(APT_PKGS) >/dev/null 2>&1 || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PKGS); }

$(STAMP): $(SOURCES) $(PACKAGE_DIRS)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "scikit-build-core>=0.10"
	# This pin installs a CPU build here; an unpinned torch pulls gigabytes of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-build-isolation -e '.[dev,bench,hf,trl,ray]'
	@touch $@

lint: setup
	$(VENV)/bin/ruff check .

# Every benchmark suite; results under bench-results/. `make bench ARGS=--quick` for the 10-minute version,
# `make bench ARGS="--publish docs"` to refresh docs/benchmarks.md.
bench: setup
	$(PY) -m bench.cli all $(ARGS)

clean:
	rm -rf build $(VENV)
