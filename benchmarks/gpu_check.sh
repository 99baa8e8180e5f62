#!/usr/bin/env bash
# The GPU checks, in one run, for a host with an NVIDIA GPU (the lent H200 machine, or any
# CUDA host): the conformance suite against the cuda backend, CUDA Graph replay vs eager, and
# the default policy's stages warmed up through the engine with cuda:0 in the fleet (per stage:
# warm-up latency on cuda:0 against the host's runtimes, and where it was placed).
#
# The lent machine has torch (a CUDA build) but no package registry, so hetero is not
# pip-installed there: this script lays out the `hetero.*` namespace with symlinks (the same
# mapping setup.py makes) and writes a dist-info whose entry points register the backends and
# the conformance plugin. Pure-Python dependencies the host lacks travel in $DEPS (a folder
# made here with `pip install --target`), if given.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/hetero-gpu-check}"
mkdir -p "$out"
site="$(mktemp -d)"
mkdir -p "$site/hetero/backends"
for folder in framework cache sandbox policies models; do ln -s "$repo/$folder" "$site/hetero/$folder"; done
for backend in cuda rocm npu sim; do ln -s "$repo/backends/$backend" "$site/hetero/backends/$backend"; done
mkdir -p "$site/hetero-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: hetero\nVersion: 0.1.0\n' > "$site/hetero-0.1.0.dist-info/METADATA"
cat > "$site/hetero-0.1.0.dist-info/entry_points.txt" <<'EPS'
[hetero.backends]
cuda = hetero.backends.cuda.detect:detect
npu = hetero.backends.npu.detect:detect
sim = hetero.backends.sim.detect:detect

[hetero.plugins]
models = hetero.models.plugin:register

[pytest11]
hetero_conformance = hetero.framework.conformance.plugin
EPS
export PYTHONPATH="$site${DEPS:+:$DEPS}"
export PYTHONSAFEPATH=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())" | tee "$out/env.txt"
nvidia-smi topo -m | tee "$out/topo.txt" || true
python3 -m hetero.framework.cli devices --json > "$out/devices.json" || true
set +e
(cd "$repo" && python3 -m pytest -q -p no:cacheprovider --import-mode=importlib \
    --hetero-backend=cuda tests/backends/test_conformance.py) 2>&1 | tee "$out/conformance.txt"
python3 "$repo/benchmarks/gpu_graph_capture.py" 2>&1 | tee "$out/graph_capture.txt"
python3 "$repo/benchmarks/gpu_serve_check.py" > "$out/serve.json" 2> "$out/serve.txt"
tail -5 "$out/serve.txt"
