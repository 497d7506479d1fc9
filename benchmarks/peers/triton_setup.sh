#!/usr/bin/env bash
# Triton Inference Server on the CPU, in a virtual environment of its own (never a bertzoo dependency), for
# tests/test_triton_server.py (BERTZOO_TRITON_VENV=VENV) and benchmarks/common/triton_peer.py:
#
#     bash benchmarks/peers/triton_setup.sh /tmp/triton-venv
#
# Triton itself ships as a container; the PyPI package nvidia-pytriton carries a build of the server (the
# `tritonserver` binary, its Python backend, and the backend's stub for each Python version) inside its wheel, and
# that is the only Triton a machine without a container runtime can install. This build has no onnxruntime
# backend, so the repository's `bertzoo` model runs bertzoo's ONNX Runtime engine in its own process (ENGINE
# onnxruntime; export/triton_python_model.py), with this venv (bertzoo installed in it) as the model's Python. Also
# for tests/test_triton_server.py (BERTZOO_TRITON_VENV=VENV; .ci/run sets it up).
#
# VENV/backends/python is the backend directory to pass to `tritonserver --backend-directory`: the backend, its
# Python module and the stub built for this machine's python3.
set -euo pipefail
venv=${1:?usage: triton_setup.sh VENV}

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --no-deps nvidia-pytriton==0.7.0
# bertzoo itself, for the model's Python: the venv is also the EXECUTION_ENV_PATH the model's config names. numpy 1:
# this build's Python-backend stub misread BYTES inputs (the texts) with numpy 2 here.
root=$(cd "$(dirname "$0")/../.." && pwd)
"$venv/bin/pip" install -q 'numpy<2' "$root[serve]"
rm -rf "$root/build"
server=$("$venv/bin/python" -c 'import importlib.util as u, os; print(os.path.join(u.find_spec("pytriton").submodule_search_locations[0], "tritonserver"))')
version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ -x "$server/python_backend_stubs/$version/triton_python_backend_stub" ] \
  || { echo "triton_setup.sh: nvidia-pytriton has no Python backend stub for python$version" >&2; exit 1; }
mkdir -p "$venv/backends/python"
ln -sf "$server/backends/python/libtriton_python.so" "$server/backends/python/triton_python_backend_utils.py" \
  "$server/python_backend_stubs/$version/triton_python_backend_stub" "$venv/backends/python/"
ln -sf "$server/bin/tritonserver" "$venv/bin/tritonserver"
if ldd "$server/bin/tritonserver" | grep -q "not found"; then
  echo "triton_setup.sh: tritonserver misses libraries here:" >&2; ldd "$server/bin/tritonserver" | grep "not found" >&2; exit 1
fi
echo "Triton: $venv/bin/tritonserver --backend-directory $venv/backends"
