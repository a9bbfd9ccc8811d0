#!/usr/bin/env bash
# The cluster tier: build (or reuse) the pinned binaries, deploy the whole platform with
# Ansible (site.yml, local inventory) on its own ports and state directory, run the
# conformance suite, the control plane's acceptance path, the Ansible convergence checks and
# the lifecycle tests, and take the cluster down again, also when something fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv=$PWD/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir PATH=$bin_dir:$PATH
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-cluster-tier.XXXXXX")
export WARREN_HOME
# PostgreSQL runs as its own user with its data under $WARREN_HOME: let it through (mktemp
# made the directory 0700; /var/lib/warren, the default, is 0755).
chmod 0711 "$WARREN_HOME"
export WARREN_TEST_CONFIG=$PWD/tests/cluster/warren-test.yaml
results=$PWD/test-results
mkdir -p "$results"

cleanup() {
  "$venv/warren" cluster down --wipe --config "$WARREN_TEST_CONFIG" || true
  rm -rf --one-file-system "$WARREN_HOME"  # never through a mount that survived
}
trap cleanup EXIT

# The whole platform as `make deploy` deploys it: playbooks/site.yml with the local inventory
# (the local cluster, the platform's objects, SeaweedFS, blockd and its CSI plugin, the
# control plane), its state under $WARREN_HOME, its settings from $WARREN_CONFIG.
export WARREN_CONFIG=$WARREN_TEST_CONFIG ANSIBLE_CONFIG=$PWD/ansible.cfg
if ! "$venv/ansible-playbook" -i inventories/local/hosts.yml playbooks/site.yml > "$results/site-first-run.log"; then
  tail -60 "$results/site-first-run.log"
  exit 1
fi
grep -A1 "PLAY RECAP" "$results/site-first-run.log"
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
