#!/usr/bin/env bash
# The nodes tier: the local cluster with two joined nodes (each its own kubelet, containerd,
# runsc, kube-proxy and egress floor, in network and mount namespaces of its own), real
# gVisor pods on both, and the host left as it was once the cluster is down.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv=$PWD/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir PATH=$bin_dir:$PATH
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-nodes-tier.XXXXXX")
export WARREN_HOME
export WARREN_TEST_CONFIG=$PWD/tests/nodes/warren-nodes.yaml
results=$PWD/test-results
mkdir -p "$results"

cleanup() {
  "$venv/warren" cluster down --wipe --config "$WARREN_TEST_CONFIG" > /dev/null 2>&1 || true
  rm -rf --one-file-system "$WARREN_HOME"
}
trap cleanup EXIT

if ! "$venv/warren" cluster up --config "$WARREN_TEST_CONFIG" > "$results/nodes-up.log" 2>&1; then
  tail -40 "$results/nodes-up.log"
  exit 1
fi
"$venv/pytest" -m nodes -rP --durations=5 tests/nodes --junitxml "$results/nodes.xml"
