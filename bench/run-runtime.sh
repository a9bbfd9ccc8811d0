#!/usr/bin/env bash
# `make bench-runtime`: a throw-away local cluster (its own ports and state), the platform
# applied, bench/runtime.py against it, and the cluster taken down again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=$PWD/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-bench.XXXXXX")
export WARREN_HOME
config=$PWD/tests/cluster/warren-floor.yaml
cleanup() { "$venv/warren" cluster down --wipe --config "$config" || true; rm -rf --one-file-system "$WARREN_HOME"; }
trap cleanup EXIT
"$venv/warren" cluster up --config "$config"
"$venv/warren" apply --config "$config"
"$venv/python" bench/runtime.py --kubeconfig "$("$venv/warren" cluster kubeconfig)" --bin-dir "$bin_dir" "$@"
