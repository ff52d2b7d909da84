#!/usr/bin/env bash
# Build the single install manifest of a release from the kustomizations (deploy/release):
#   deploy/release.sh                    -> dist/gpu-queue-scaler-<version>.yaml
#   KEDA_NAMESPACE=keda-system MONITORING_NAMESPACE=observability deploy/release.sh
#   OUT=/tmp/x.yaml deploy/release.sh
# <version> is pyproject.toml's (the one `scaler --version` prints); the images in the manifests
# must carry it as their tag, or this fails rather than ship a manifest running another version.
# Needs kubectl >= 1.32 (docs/compatibility.md; its built-in kustomize) and python3.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kubectl=${KUBECTL:-kubectl}
version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
keda=${KEDA_NAMESPACE:-keda}
monitoring=${MONITORING_NAMESPACE:-monitoring}
out=${OUT:-$root/dist/gpu-queue-scaler-$version.yaml}

# A namespace name is a DNS label (RFC 1123): say which setting is wrong, and what is accepted.
for setting in "KEDA_NAMESPACE=$keda" "MONITORING_NAMESPACE=$monitoring"; do
  value=${setting#*=}
  if ! [[ $value =~ ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$ ]]; then
    echo "release.sh: ${setting%%=*}: '$value' is not a namespace name (a DNS label: lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit)" >&2
    exit 2
  fi
done

# Build a copy of deploy/ with the namespaces written into its release settings, so the tree
# itself is never edited.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -R "$root/deploy" "$work/deploy"
printf 'keda=%s\nmonitoring=%s\n' "$keda" "$monitoring" > "$work/deploy/release/namespaces.env"
"$kubectl" kustomize "$work/deploy/release" > "$work/release.yaml"

# Every image of the release runs this version.
images=$(grep -E '^[[:space:]]+image: ' "$work/release.yaml" | sed -E 's/^[[:space:]]+image: //' | sort -u)
for image in $images; do
  case "$image" in
    ghcr.io/gpu-queue-scaler/gpu-queue-scaler:*)
      if [ "${image##*:}" != "$version" ]; then
        echo "release.sh: $image in the manifests, but the version is $version: update the image tags in deploy/" >&2
        exit 1
      fi
      ;;
  esac
done

mkdir -p "$(dirname "$out")"
{
  echo "# gpu-queue-scaler $version: kubectl apply -f $(basename "$out")"
  echo "# Built by deploy/release.sh from deploy/release (KEDA namespace: $keda; monitoring: $monitoring)."
  cat "$work/release.yaml"
} > "$out"
echo "$out"
