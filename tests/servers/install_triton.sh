#!/usr/bin/env bash
# Install a CPU-runnable Triton Inference Server (PyPI nvidia-pytriton, ships Triton 2.51)
# into its own venv, .venv-triton at the repo root. pytriton needs numpy<2, so it never goes
# into the main venv. Idempotent: a stamp file inside the venv makes a second run a no-op.
set -euo pipefail

PYTRITON_VERSION="0.7.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${REPO_ROOT}/.venv-triton"
STAMP="${VENV}/.installed-nvidia-pytriton-${PYTRITON_VERSION}"
PYTHON="${PYTHON:-python3}"

if [[ -f "${STAMP}" && -x "${VENV}/bin/python" ]]; then
    echo "install_triton: ${VENV} already has nvidia-pytriton==${PYTRITON_VERSION}"
    exit 0
fi

if [[ ! -x "${VENV}/bin/python" ]]; then
    echo "install_triton: creating ${VENV} with $("${PYTHON}" --version 2>&1)"
    "${PYTHON}" -m venv "${VENV}"
fi

"${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check \
    "nvidia-pytriton==${PYTRITON_VERSION}"

# Fail here, not in a test, if the package does not import.
"${VENV}/bin/python" -c "import pytriton, numpy; print('pytriton', pytriton.__version__ if hasattr(pytriton, '__version__') else '?', 'numpy', numpy.__version__)"

date -u +%Y-%m-%dT%H:%M:%SZ > "${STAMP}"
echo "install_triton: done"
