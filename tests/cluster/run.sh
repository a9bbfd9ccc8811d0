#!/usr/bin/env bash
# The cluster tier: build (or reuse) the pinned binaries, deploy the whole platform with
# Ansible (site.yml, local inventory) on its own ports and state directory: the local cluster,
# the floor, and Warren's own services as workloads in warren-system from images built here
# and imported into the node. Then the conformance suite (the floor, real pods, the platform
# tier through the edge with the first key), the workloads' checks, the control plane's
# controller tests, the Ansible convergence checks and the lifecycle tests; the cluster goes
# down again, also when something fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv=$PWD/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir PATH=$bin_dir:$PATH
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-cluster-tier.XXXXXX")
export WARREN_HOME
# The egress gateway's tests: a throw-away CA, and the tier's configuration with the
# gateway trusting it (services.gateway_trusted_ca) for the HTTPS test hosts it signs.
gateway_ca=$(mktemp -d "${TMPDIR:-/tmp}/warren-gateway-ca.XXXXXX")
"$venv/python" tests/cluster/with_gateway_ca.py tests/cluster/warren-test.yaml "$gateway_ca" "$gateway_ca/warren-test.yaml"
export WARREN_TEST_CONFIG=$gateway_ca/warren-test.yaml
results=$PWD/test-results
mkdir -p "$results"

cleanup() {
  "$venv/warren" cluster down --wipe --config "$WARREN_TEST_CONFIG" || true
  rm -rf --one-file-system "$WARREN_HOME"  # never through a mount that survived
  rm -rf "$gateway_ca"
}
trap cleanup EXIT

# The whole platform as `make deploy` deploys it: playbooks/site.yml with the local inventory,
# its state under $WARREN_HOME, its settings from $WARREN_CONFIG.
export WARREN_CONFIG=$WARREN_TEST_CONFIG ANSIBLE_CONFIG=$PWD/ansible.cfg
if ! "$venv/ansible-playbook" -i inventories/local/hosts.yml playbooks/site.yml > "$results/site-first-run.log"; then
  tail -60 "$results/site-first-run.log"
  exit 1
fi
grep -A1 "PLAY RECAP" "$results/site-first-run.log"
kubeconfig=$("$venv/warren" cluster kubeconfig)
records=$WARREN_HOME/cluster/control-plane
# The node is this machine: start real gVisor pods and prove the egress floor against test
# hosts made here in network namespaces. Kubernetes' own Pod Security corpus at the pinned
# version is named explicitly so that the suite fails rather than skips if it cannot be
# read. The platform tier goes through the edge's Service with the install Job's first key.
image=$("$venv/python" -c 'from warren.node.images import busybox_image; print(busybox_image())')
"$venv/warren" conformance --kubeconfig "$kubeconfig" \
  --config "$WARREN_TEST_CONFIG" --junitxml "$results/conformance.xml" \
  --runtime-tests --egress-test-hosts local --image "$image" \
  --pod-security-fixtures "$(tools/pod-security-fixtures.sh)" \
  --api-url "$(cat "$records/url")" --api-key-file "$records/api-key" --gateway-test-ca "$gateway_ca"
# Warren's services as workloads: rolled out, leader elected, Secrets on the cluster only,
# nothing of Warren's on the host outside a pod; warren-blockd rolled under writing sandboxes.
# --durations: the slowest tests, for keeping the tier's time in check.
WARREN_KUBECONFIG=$kubeconfig "$venv/pytest" -m workloads -rP --durations=5 tests/workloads \
  --junitxml "$results/workloads.xml"
# The control plane's controller on the same cluster, in namespaces of its own, with the
# agent image the deployed platform delivers into sandboxes (the node has it).
agent_image=$(WARREN_KUBECONFIG=$kubeconfig "$venv/python" -c '
import os
from kubernetes import client, config
config.load_kube_config(os.environ["WARREN_KUBECONFIG"])
deployment = client.AppsV1Api().read_namespaced_deployment("warren-control", "warren-system")
args = deployment.spec.template.spec.containers[0].args
print(next(a.split("=", 1)[1] for a in args if a.startswith("--agent-image=")))')
WARREN_KUBECONFIG=$kubeconfig WARREN_TEST_IMAGE=$image WARREN_AGENT_IMAGE=$agent_image \
  packages/warren-control/tests/run-cluster.sh --durations=10 --junitxml "$results/control-cluster.xml"
"$venv/pytest" -m cluster --durations=15 tests/cluster --junitxml "$results/cluster.xml"
