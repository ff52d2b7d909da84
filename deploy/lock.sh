#!/usr/bin/env bash
# Regenerate the image's hashed lock files from pyproject.toml (run it after any change to
# [project] dependencies or [build-system] requires, or to the base image in deploy/Dockerfile):
#   deploy/lock.sh             -> deploy/requirements.lock, deploy/build-requirements.lock
#   UPGRADE=1 deploy/lock.sh   -> the newest versions the specifiers admit (else the current pins
#                                 are kept wherever they still fit)
# Resolved by uv for the base image's CPython (its version is read from deploy/Dockerfile) on
# Linux; every file of each pinned version is hashed, so amd64 and arm64 builds use the same lock.
# Only [project] dependencies: no extras (test, bench, sim), which the image does not carry.
# Needs python3 >= 3.11 and the package index; uv is installed into .cache/ when not on PATH.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
uv_version=0.13.8

uv=${UV:-$(command -v uv || true)}
if [ -z "$uv" ]; then
  tools="$root/.cache/lock-tools-uv-$uv_version"
  if [ ! -x "$tools/bin/uv" ]; then
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet "uv==$uv_version"
  fi
  uv="$tools/bin/uv"
fi

# The base image's Python version: the tag in the Dockerfile's PYTHON_IMAGE (python:X.Y.Z-...).
python_version=$(sed -nE 's/^ARG PYTHON_IMAGE=python:([0-9]+\.[0-9]+\.[0-9]+)-.*/\1/p' "$root/deploy/Dockerfile")
if [ -z "$python_version" ]; then
  echo "lock.sh: deploy/Dockerfile: no 'ARG PYTHON_IMAGE=python:X.Y.Z-...' line to read the Python version from" >&2
  exit 2
fi

upgrade=()
if [ "${UPGRADE:-}" = 1 ]; then upgrade=(--upgrade); fi

compile() {  # compile <output> <input> [uv args...]
  local out=$1 in=$2
  shift 2
  (cd "$root" && "$uv" pip compile "$in" "$@" "${upgrade[@]}" \
    --generate-hashes --quiet \
    --python-version "$python_version" --python-platform x86_64-unknown-linux-gnu \
    --custom-compile-command "deploy/lock.sh" \
    --output-file "$out")
  # The target, for tests/surface/test_image.py to check against the Dockerfile's base image.
  python3 - "$root/$out" "$python_version" <<'EOF'
import sys
path, version = sys.argv[1], sys.argv[2]
with open(path, encoding="utf-8") as f:
    lines = [line for line in f if not line.startswith("# python-version: ")]
lines.insert(2, f"# python-version: {version} (the base image of deploy/Dockerfile), linux\n")
with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)
EOF
}

compile deploy/requirements.lock pyproject.toml

# [build-system] requires, read from pyproject.toml (the wheel is built without build isolation).
build_in=$(mktemp)
trap 'rm -f "$build_in"' EXIT
python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
  "$root/pyproject.toml" > "$build_in"
compile deploy/build-requirements.lock "$build_in"
# uv names the temporary input file in the annotations: name pyproject.toml instead.
sed -i -E "s|^(    # via -r ).*|\1pyproject.toml [build-system]|; s|^(    #   -r ).*|\1pyproject.toml [build-system]|" \
  "$root/deploy/build-requirements.lock"

echo "lock.sh: wrote deploy/requirements.lock and deploy/build-requirements.lock (CPython $python_version, linux)"
