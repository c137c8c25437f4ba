# Two set-up commands on a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PY_SOURCES := dra_driver devtools tests benchmarks hack/demo hack/gpu-check hack/local-cluster \
	hack/local-node hack/build-image

.PHONY: demo test unit integration lint e2e bench proto image clean

# pip's output (build backend warnings included) goes to $(VENV)/install.log; its end is shown
# when the install fails.
$(STAMP): pyproject.toml
	@echo "python environment: $(VENV) (pip install -e '.[test]', log $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install --upgrade pip && $(PY) -m pip install -e '.[test]'; } \
		>$(VENV)/install.log 2>&1 || { tail -n 30 $(VENV)/install.log; exit 1; }
	@touch $(STAMP)

demo: $(STAMP)
	hack/install-node-prereqs
	$(PY) hack/demo

TEST_TARGETS := lint unit integration e2e

# Runs every tier even when one fails (a unit failure must not hide the e2e results), prints
# one result line per tier at the end and fails if any tier failed.
test:
	@status=0; summary=""; \
	for t in $(TEST_TARGETS); do \
		if $(MAKE) --no-print-directory $$t; then r=passed; else r=FAILED; status=1; fi; \
		summary="$$summary make test: $$t $$r\n"; \
	done; \
	printf "$$summary" | sed 's/^ //'; \
	exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV)/bin/mypy

# unit: in-process tests (pure code, gRPC over unix sockets, fakes), under 30 s warm.
unit: $(STAMP)
	$(PY) -m pytest -m 'not e2e and not gpu and not integration' -q

# integration: real processes (the plugin and the CLI as subprocesses, SIGKILLs, helm, protoc,
# make, a control plane without nodes), multi-second timeouts. The tools are built first: a
# cold build (~10 min) inside a test would run past pytest's 300 s per-test timeout.
INTEGRATION_TOOLS := etcd kube-apiserver kube-controller-manager kube-scheduler helm

integration: $(STAMP)
	hack/install-node-prereqs
	hack/build-k8s $(INTEGRATION_TOOLS)
	$(PY) -m pytest -m 'integration and not e2e and not gpu' -q

e2e: $(STAMP)
	hack/install-node-prereqs
	hack/build-k8s
	$(PY) -m pytest -m e2e -q

# bench: every script in benchmarks/ at full size (each prints its table and ends with a
# `<name>: <number>` line; `make integration` and `make e2e` run them with --smoke). In process
# or with simulated GPUs, no cluster: bench_prepare, bench_prepare_mps (the real MPS enforcer
# and the MPS emulator), bench_prepare_under_load,
# bench_garbage_memory, bench_mps_service, bench_hooks (the createRuntime hooks of a claim's
# containers against a no-op). A kubelet-less local control plane of their own
# (benchlib.local_cluster: hack/local-cluster up, down at the end; its binaries built here
# first): bench_scheduler (50 and 150 nodes: long on 2 cores), bench_packing, check_modes,
# bench_api_requests (the plugin's API requests from the API server's audit log; 10 idle
# minutes). A
# local cluster of its own with one real node: bench_pod_start (node prerequisites first).
CLUSTER_TOOLS := etcd kube-apiserver kube-controller-manager kube-scheduler helm

bench: $(STAMP)
	$(PY) benchmarks/bench_prepare.py
	$(PY) benchmarks/bench_prepare_mps.py
	$(PY) benchmarks/bench_prepare_under_load.py
	$(PY) benchmarks/bench_garbage_memory.py
	$(PY) benchmarks/bench_mps_service.py
	$(PY) benchmarks/bench_hooks.py
	hack/build-k8s $(CLUSTER_TOOLS)
	$(PY) benchmarks/bench_scheduler.py
	$(PY) benchmarks/bench_packing.py
	$(PY) benchmarks/check_modes.py
	$(PY) benchmarks/bench_api_requests.py
	hack/install-node-prereqs
	$(PY) benchmarks/bench_pod_start.py

proto: $(STAMP)
	hack/gen-proto

# OCI image archives in build/images/ (plugin, pause, busybox, tenant); no Docker or registry
# needed.
image:
	hack/install-node-prereqs
	hack/build-image

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
