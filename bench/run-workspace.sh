#!/usr/bin/env bash
# `make bench-workspace` (as root): a throw-away platform deployed as `make deploy` does it (its
# own ports and state: the cluster tier's configuration), bench/workspace.py against it through
# the edge, and everything taken down again. Writes bench/results/workspace.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=$PWD/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-bench-workspace.XXXXXX")
export WARREN_HOME
chmod 0711 "$WARREN_HOME"  # PostgreSQL's own user reaches its data under it
config=$PWD/tests/cluster/warren-test.yaml
cleanup() { "$venv/warren" cluster down --wipe --config "$config" || true; rm -rf --one-file-system "$WARREN_HOME"; }
trap cleanup EXIT
WARREN_CONFIG=$config ANSIBLE_CONFIG=$PWD/ansible.cfg \
  "$venv/ansible-playbook" -i inventories/local/hosts.yml playbooks/site.yml > "$WARREN_HOME/site.log" \
  || { tail -60 "$WARREN_HOME/site.log"; exit 1; }
state=$WARREN_HOME/cluster/control-plane
image=$("$venv/python" -c 'from warren.node.images import busybox_image; print(busybox_image())')
"$venv/python" bench/workspace.py --url "$(cat "$state/url")" --api-key "$(cat "$state/api-key")" \
  --image "$image" "$@"
