#!/usr/bin/env bash
# The cluster tier: build (or reuse) the pinned binaries, bring a throw-away local cluster
# up on its own ports and state directory, apply the floor, deploy the workspace layer and the
# control plane, run
# the conformance suite, the control plane's acceptance path and the lifecycle tests, and
# take the cluster down again, also when something fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv=$PWD/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir PATH=$bin_dir:$PATH
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-cluster-tier.XXXXXX")
export WARREN_HOME
export WARREN_TEST_CONFIG=$PWD/tests/cluster/warren-test.yaml
results=$PWD/test-results
mkdir -p "$results"

cleanup() {
  "$venv/warren" cluster down --wipe --config "$WARREN_TEST_CONFIG" || true
  rm -rf --one-file-system "$WARREN_HOME"  # never through a mount that survived
}
trap cleanup EXIT

"$venv/warren" cluster up --config "$WARREN_TEST_CONFIG"
"$venv/warren" apply --config "$WARREN_TEST_CONFIG"
# The workspace layer and the control plane as `make deploy` runs them (SeaweedFS, blockd and
# its CSI plugin on the node; records, keys and process under $WARREN_HOME).
"$venv/warren" workspaces up --config "$WARREN_TEST_CONFIG"
"$venv/warren" control-plane up --config "$WARREN_TEST_CONFIG"
# The node is this machine: start real gVisor pods and prove the egress floor against test
# hosts made here in network namespaces.
image=$("$venv/python" -c 'from warren.node.images import busybox_image; print(busybox_image())')
"$venv/warren" conformance --kubeconfig "$("$venv/warren" cluster kubeconfig)" \
  --config "$WARREN_TEST_CONFIG" --junitxml "$results/conformance.xml" \
  --runtime-tests --egress-test-hosts local --image "$image"
# The control plane's controller on the same cluster, in namespaces of its own.
WARREN_KUBECONFIG=$("$venv/warren" cluster kubeconfig) WARREN_TEST_IMAGE=$image \
  packages/warren-control/tests/run-cluster.sh --junitxml "$results/control-cluster.xml"
"$venv/pytest" -m cluster tests/cluster --junitxml "$results/cluster.xml"
