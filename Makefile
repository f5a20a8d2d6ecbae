# simgraph — setup and tests. `make test` is what CI runs (via .ci/run).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# ffcv build deps, and the Fashion-MNIST files the built-in source and the tests read.
APT_PKGS := pkg-config libopencv-dev libturbojpeg0-dev dataset-fashion-mnist
# Only the tests need these: `ip netns` / `ss` for the two-node loopback cluster.
TEST_APT_PKGS := iproute2
# Only the learning benchmarks need these: real captioned images (Tux Paint stamps).
BENCH_APT_PKGS := tuxpaint-stamps-default
STAMP := $(VENV)/.installed
# Benchmarks that start Ray run in a loopback-only network namespace, as the tests do.
NETNS_RUN := unshare -n bash -c 'ip link set lo up && HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

.PHONY: setup apt-deps bench-deps test lint demo gpu-kit bench-objectives bench-parity bench-reproduce bench-sweep bench-sweep-efficiency clean

setup: $(STAMP)

# Install the apt packages named in $(1) that are missing.
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

# apt packages ffcv builds against; installed only when missing.
apt-deps:
	$(call apt_install,$(APT_PKGS) $(TEST_APT_PKGS))

bench-deps: setup
	$(call apt_install,$(BENCH_APT_PKGS))
	@# bench/reader_224.py's decode floor: libjpeg-turbo, one thread.
	@$(PY) -c 'import simplejpeg' 2>/dev/null || $(PY) -m pip install -q simplejpeg

# Installs with uv: the same pins and versions as pip (compared with `pip freeze`), from the
# same sources (pip's configuration passed on by .ci/pip_sources.py; pip's resolution across
# indexes: unsafe-best-match), in ~40 s from a cold cache against pip's ~3 min
# (docs/benchmarks.md). pip is the fallback wherever uv cannot install. --compile-bytecode:
# as pip does; without .pyc files every process that runs with -B (multiprocessing's
# spawned children of a -B parent) compiles torch & co. from source on each import (the
# suite took 26 min instead of 14 in a fresh clone).
UV_VERSION := 0.13.9
UV_PIP = $(VENV)/bin/uv pip install -q -p $(PY) --compile-bytecode --index-strategy unsafe-best-match \
	$$($(PY) .ci/pip_sources.py)

# FFCV has no wheel on the index, only an sdist whose setup.py imports numpy: built against
# the venv's numpy (--no-build-isolation) in ~20 s, which uv repeats for every new venv (its
# cache does not cover a build in a foreign environment). The wheel is built once per FFCV,
# numpy and Python version into FFCV_WHEELHOUSE and installed from there by every later
# `make setup` (a fresh clone, CI on the same machine); where the build fails, uv builds it.
FFCV_WHEELHOUSE ?= $(HOME)/.cache/simgraph/wheels/ffcv-1.0.2-numpy-2.4.6
FFCV_WHEEL = $$(ls $(FFCV_WHEELHOUSE)/ffcv-1.0.2-$$($(PY) -c 'import sys; v = sys.version_info; \
	print(f"cp{v[0]}{v[1]}")')-*.whl 2>/dev/null | head -n 1)

$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory apt-deps
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	# numpy first: ffcv's setup.py imports it at build time.
	@if $(PY) -m pip install -q uv==$(UV_VERSION) && \
	    $(UV_PIP) setuptools wheel numpy==2.4.6 && \
	    { [ -n "$(FFCV_WHEEL)" ] || $(PY) -m pip wheel -q --no-deps --no-build-isolation \
	        -w $(FFCV_WHEELHOUSE) ffcv==1.0.2 || true; } && \
	    if [ -n "$(FFCV_WHEEL)" ]; then $(UV_PIP) "$(FFCV_WHEEL)"; \
	    else $(UV_PIP) --no-build-isolation ffcv==1.0.2; fi && \
	    $(UV_PIP) -e '.[dev,bench]'; then echo "installed with uv"; else \
	  echo "uv could not install: installing with pip" >&2 && \
	  $(PY) -m pip install -q --upgrade pip setuptools wheel && \
	  $(PY) -m pip install -q numpy==2.4.6 && \
	  { $(PY) -m pip install -q --no-build-isolation ffcv==1.0.2 || $(PY) -m pip install -q ffcv==1.0.2; } && \
	  $(PY) -m pip install -q -e '.[dev,bench]'; fi
	@touch $(STAMP)

# The suite runs inside a loopback-only network namespace: Ray stays on 127.0.0.1 and
# anything that tries to download at run time fails. Local Rays start without their
# dashboard (the default, components/runtime/session.py: ~2.4 s a start; the suite starts ~25);
# SIMGRAPH_RAY_DASHBOARD=0 keeps it off even for a sweep with Train worker groups, which would
# otherwise ask for it (the suite has none). RAY_prestart_worker_first_driver=0: a new local
# Ray does not start one idle worker per CPU for its first driver (Train runs, Tune trials and
# Ray Data actors start their own processes; ~3 of a tiny Train run's ~34 CPU-seconds here,
# where the suite is CPU-bound: docs/benchmarks.md). Users keep Ray's default: on a larger
# machine the warm workers are ready when the first tasks come.
# Two phases: every test but the cluster ones on TEST_WORKERS pytest-xdist workers (a test
# file stays on one worker: its module fixtures are built once; the files with most slow tests
# go first, tests/conftest.py; most slow tests wait on Ray and process start-up, so two
# streams overlap well on 2 cores), then tests/e2e/test_cluster.py alone. Its cluster is removed by killing its own network namespace's processes (no `ray
# stop --force`: other Rays on the machine survive), but beside the other stream its sweep
# over both nodes waited forever for a placement group (2026-11-26: a freed trial's bundles
# not yet returned under load), so it keeps a phase of its own. Exit status 5 (nothing
# selected, e.g. PYTEST_ARGS="-k cone" in the cluster phase) counts as success.
PYTEST_ARGS ?= --durations=25
TEST_WORKERS ?= 2

test: setup lint
	@unshare -n true 2>/dev/null || { echo "make test: cannot create a network namespace (unshare -n); run as root or with CAP_SYS_ADMIN" >&2; exit 1; }
	unshare -n bash -c 'ip link set lo up && export HF_HUB_OFFLINE=1 SIMGRAPH_RAY_DASHBOARD=0 RAY_prestart_worker_first_driver=0 && \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/e2e/test_cluster.py $(PYTEST_ARGS) && \
	  { $(PY) -m pytest -q tests/e2e/test_cluster.py $(PYTEST_ARGS); rc=$$?; [ $$rc = 5 ] && rc=0; exit $$rc; }'

# mypy's incremental cache outside the checkout: a fresh clone on a machine that ran it before
# checks in ~1 s instead of ~25 (mypy revalidates each cached module by its source's hash, so
# an edited file, or another mypy or package version, is analysed again).
MYPY_CACHE ?= $(HOME)/.cache/simgraph/mypy

lint: setup
	$(VENV)/bin/ruff check components pipelines tests bench
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE) components pipelines
	$(VENV)/bin/lint-imports

# The README's first command: Fashion-MNIST subset -> SimCLR, SupCon, X-CLR on 2 CPU workers.
demo: setup
	$(VENV)/bin/simgraph run pipelines/configs/demo.yaml

bench-objectives: setup
	$(PY) bench/objectives.py

# Pipeline vs plain PyTorch loop, several seeds (docs/results.md); ARGS="--datasets fmnist ...".
bench-parity: bench-deps
	$(NETNS_RUN) $(PY) bench/parity.py $(ARGS)'

# The papers' claims at a CPU budget (docs/results.md); ARGS="--losses simclr supcon ...".
bench-reproduce: bench-deps
	$(NETNS_RUN) $(PY) bench/reproduce.py $(ARGS)'

# A sweep's wall time against its trials' training (docs/benchmarks.md); the demo sweep reads
# data/demo, which `make demo` builds. ARGS="--modes in_trial --concurrency 1 auto".
bench-sweep: setup
	$(NETNS_RUN) $(PY) bench/sweep_overhead.py $(ARGS)'

# TPE + ASHA, TPE and random search against a full grid, confirmed on the test split
# (docs/results.md); ARGS="--per-class 150 --epochs 6 --out FILE".
bench-sweep-efficiency: setup
	$(NETNS_RUN) $(PY) bench/sweep_efficiency.py $(ARGS)'

clean:
	rm -rf $(VENV)

# The offline kit for a GPU node without network access (docs/gpu.md): what the node lacks
# (Ray, FFCV built for its Python with its libraries vendored, Optuna, ...) for KIT_PYTHON's
# version, in pieces of at most 60 MiB, and Fashion-MNIST for bench/gpu_check.py. KIT_HAVE
# lists the node's packages (pip list --format=freeze there); KIT_PYTHON is an interpreter of
# the node's version here (pyenv's 3.12 on this machine).
KIT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python) python3.12)
KIT_HAVE ?= examples/offline/gpu-node-packages.txt
KIT_TRAIN_IMAGES ?= 40000
gpu-kit: setup
	$(PY) -m pipelines.offline_kit --python $(KIT_PYTHON) --have $(KIT_HAVE) --out .kit \
	  --fashion-mnist --train-images $(KIT_TRAIN_IMAGES)

# The offline install proved on this machine (slow, ~20 min on 2 cores; not part of `make
# test`): a kit for this machine's Python (the venv's base interpreter) with nothing left to a
# node, so torch is carried too: the project's pins from the index, i.e. the CUDA build with
# its nvidia-* libraries (~3 GB of wheels; no CPU-only torchvision is reachable here, and the
# index's torchvision needs the CUDA torch), in 60 MiB pieces as for a transfer, packed at xz
# level OFFLINE_XZ (`make gpu-kit`'s format at level 9, ~4x faster to pack). Then a venv of that
# Python with no packages, install.sh in a network namespace without network, and simgraph run
# from the kit alone: imports, validate, preprocess (Ray Data), a 1-epoch pretrain
# (components/deploy/kit_check.py: check_install; docs/gpu.md has a run). OFFLINE_KIT_ARGS: more
# builder options, e.g. `--wheel torch-X+cpu-....whl --require torchvision==Y+cpu`.
.PHONY: offline-install-check
OFFLINE_PYTHON ?= $(shell $(PY) -c 'import sys; print(sys._base_executable)')
OFFLINE_XZ ?= 1
OFFLINE_KIT_ARGS ?=
offline-install-check: setup
	$(PY) -m pipelines.offline_kit --python $(OFFLINE_PYTHON) --out .kit-local \
	  --xz-preset $(OFFLINE_XZ) $(OFFLINE_KIT_ARGS) --check
