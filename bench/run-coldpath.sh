#!/usr/bin/env bash
# `make bench-coldpath`: a throw-away local cluster (the floor, the cluster tier's ports)
# brought up once with the kubelet's generic PLEG and once with evented PLEG
# (node.evented_pleg), the agent and base images built (or cached) and imported each time,
# and bench/coldpath.py against each. Writes bench/results/coldpath.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=$PWD/.venv/bin
control=$PWD/packages/warren-control/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-bench-coldpath.XXXXXX")
export WARREN_HOME
config=$WARREN_HOME/warren.yaml
cleanup() { "$venv/warren" cluster down --wipe --config "$config" || true; rm -rf --one-file-system "$WARREN_HOME"; }
trap cleanup EXIT

# An image of Warren's (agent, base) built, or taken from the cache, and imported into the node.
built() {
  "$venv/warren" image build "$1" --out "$WARREN_HOME/images" \
    --import "$WARREN_HOME/cluster/node/containerd/containerd.sock" --bin-dir "$bin_dir" --json |
    "$venv/python" -c '
import json, sys
print(next(f"{name}@{digest}" for name, digest in json.load(sys.stdin)["digests"].items()))'
}
image=$("$venv/python" -c 'from warren.node.images import busybox_image; print(busybox_image())')
for variant in generic evented; do
  evented=false
  [[ $variant == evented ]] && evented=true
  # The floor's configuration, with the kubelet's setting for this variant.
  "$venv/python" - "$PWD/tests/cluster/warren-floor.yaml" "$config" "$evented" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
config["cluster"].setdefault("node", {})["evented_pleg"] = sys.argv[3] == "true"
yaml.safe_dump(config, open(sys.argv[2], "w"))
PY
  "$venv/warren" cluster up --config "$config"
  "$venv/warren" apply --config "$config"
  agent=$(built agent)
  base=$(built base)
  "$control/python" bench/coldpath.py --kubeconfig "$("$venv/warren" cluster kubeconfig)" \
    --image "$image" --agent-image "$agent" --base-image "$base" --variant "$variant" \
    --into "$WARREN_HOME/variants.json" "$@"
  "$venv/warren" cluster down --wipe --config "$config"
done
"$control/python" bench/coldpath.py --finish "$WARREN_HOME/variants.json"
