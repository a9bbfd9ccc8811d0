#!/usr/bin/env bash
# The control plane's cluster tier: bring a throw-away local cluster up exactly as
# tests/cluster/run.sh does (same configuration, own ports and state directory), apply the
# floor, run the tests marked `cluster` against it, and take the cluster down again, also
# when something fails. Extra arguments go to pytest.
#
# With WARREN_KUBECONFIG already set, the tests run against that cluster, which is left as
# it is (it needs the floor applied and a node that has WARREN_TEST_IMAGE).
set -euo pipefail
package=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=$(cd "$package/../.." && pwd)
venv=$repo/.venv/bin

if [[ -z ${WARREN_TEST_IMAGE:-} ]]; then
  # The busybox image the node imports into its containerd (pods use imagePullPolicy Never).
  WARREN_TEST_IMAGE=$("$venv/python" -c 'from warren.node.images import busybox_image; print(busybox_image())')
  export WARREN_TEST_IMAGE
fi

if [[ -z ${WARREN_KUBECONFIG:-} ]]; then
  cd "$repo"
  bin_dir=$(tools/build-cluster-binaries.sh)
  export WARREN_BIN_DIR=$bin_dir PATH=$bin_dir:$PATH
  WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-control-cluster.XXXXXX")
  export WARREN_HOME
  config=$repo/tests/cluster/warren-floor.yaml
  cleanup() {
    "$venv/warren" cluster down --wipe --config "$config" || true
    rm -rf --one-file-system "$WARREN_HOME"  # never through a mount that survived
  }
  trap cleanup EXIT
  "$venv/warren" cluster up --config "$config"
  "$venv/warren" apply --config "$config"
  WARREN_KUBECONFIG=$("$venv/warren" cluster kubeconfig)
  export WARREN_KUBECONFIG
fi

cd "$package"
.venv/bin/pytest -m cluster "$@"
