#!/usr/bin/env bash
# `make bench-control` and `make bench-start` (the first argument: control or start): the
# controller's reconcile rate on a throw-away kwok control plane (simulated nodes) against the
# same pods made directly, then a throw-away local cluster (its own ports and state) with the
# floor applied, and bench/control.py or bench/start.py against it: the control plane as
# `serve --role all`, sandboxes through the edge against the same pods made directly; for
# start, then the platform deployed by site.yml (bench/warren-bench.yaml), where sandboxes
# have workspaces, for forks. Writes bench/results/control.json or start.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bench=${1:?name the benchmark: control or start}
shift
[[ $bench == control || $bench == start ]] || { echo "unknown benchmark $bench: control or start" >&2; exit 2; }
venv=$PWD/.venv/bin
control=$PWD/packages/warren-control/.venv/bin
bin_dir=$(tools/build-cluster-binaries.sh)
export WARREN_BIN_DIR=$bin_dir
WARREN_HOME=$(mktemp -d "${TMPDIR:-/tmp}/warren-bench-control.XXXXXX")
export WARREN_HOME
config=$PWD/tests/cluster/warren-floor.yaml
kwok_json=$WARREN_HOME/kwok.json
cleanup() { "$venv/warren" cluster down --wipe --config "$config" || true; rm -rf --one-file-system "$WARREN_HOME"; }
trap cleanup EXIT

# Reconcile rate first, alone on the machine: nodes and sandboxes as WARREN_BENCH_NODES and
# WARREN_BENCH_SANDBOXES say (the scale test runs 1,000 and 5,000). Rounds of the reconcile
# and its baseline, one after the other on the same control plane (WARREN_BENCH_ROUNDS, 3):
# either rate alone moves by up to a third from run to run on two cores, so each figure is the
# median of its rounds, and every round is kept beside it.
(cd packages/warren-control/tests && "$control/python" - "${WARREN_BENCH_NODES:-1000}" \
  "${WARREN_BENCH_SANDBOXES:-5000}" "${WARREN_BENCH_ROUNDS:-3}" "$kwok_json" "$WARREN_HOME" <<'PY'
import json, os, statistics, sys
from pathlib import Path
from kwok_cluster import KwokCluster, measure_direct_pods, measure_reconcile
nodes, sandboxes, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out, logs = Path(sys.argv[4]), Path(sys.argv[5])
results, direct = [], []
with KwokCluster(Path(os.environ["WARREN_BIN_DIR"])) as cluster:
    cluster.add_nodes(nodes)
    for n in range(rounds):
        (logs / f"round-{n}").mkdir()
        results.append(measure_reconcile(cluster, sandboxes, log_dir=logs / f"round-{n}"))
        direct.append(measure_direct_pods(cluster, sandboxes))  # the same count, 32 threads as the creates
        print(f"round {n + 1} of {rounds}:", results[-1].summary(), f"direct pods: {direct[-1]}/s", file=sys.stderr)
median = sorted(range(rounds), key=lambda i: results[i].reconcile_per_s)[(rounds - 1) // 2]
out.write_text(json.dumps({
    "reconcile_per_s": statistics.median(r.reconcile_per_s for r in results),
    "reconcile_per_s_rounds": [r.reconcile_per_s for r in results],
    "reconcile_nodes": nodes,
    "reconcile_sandboxes": sandboxes,
    "reconcile_seconds": results[median].seconds,
    "reconcile_delete_seconds": results[median].delete_seconds,
    "direct_pods_per_s": statistics.median(direct),
    "direct_pods_per_s_rounds": direct,
}))
PY
)

"$venv/warren" cluster up --config "$config"
"$venv/warren" apply --config "$config"
image=$("$venv/python" -c 'from warren.node.images import busybox_image; print(busybox_image())')
extra=()
if [[ $bench == start ]]; then
  # Sandboxes with their agent, as deployed: the agent image built here, imported into the node.
  socket=$WARREN_HOME/cluster/node/containerd/containerd.sock
  agent=$("$venv/warren" image build agent --out "$WARREN_HOME/images" --import "$socket" \
    --bin-dir "$bin_dir" --json | "$venv/python" -c '
import json, sys
print(next(f"{name}@{digest}" for name, digest in json.load(sys.stdin)["digests"].items()))')
  extra=(--agent-image "$agent")
fi
output=()
[[ $bench == start ]] && output=(--output "$WARREN_HOME/throw-away.json")
"$control/python" "bench/$bench.py" --kubeconfig "$("$venv/warren" cluster kubeconfig)" \
  --image "$image" --kwok-json "$kwok_json" "${extra[@]}" "${output[@]}" "$@"
[[ $bench == start ]] || exit 0

# Then the platform as `make deploy` deploys it, where every sandbox has its workspace: the
# base pool's creates, cold ones, and forks into eight children, through its edge.
"$venv/warren" cluster down --wipe --config "$config"
config=$PWD/bench/warren-bench.yaml
export WARREN_CONFIG=$config ANSIBLE_CONFIG=$PWD/ansible.cfg
echo "deploying the platform (site.yml); its log: $WARREN_HOME/site.log" >&2
if ! "$venv/ansible-playbook" -i inventories/local/hosts.yml playbooks/site.yml > "$WARREN_HOME/site.log"; then
  tail -60 "$WARREN_HOME/site.log"
  exit 1
fi
records=$WARREN_HOME/cluster/control-plane
"$control/python" bench/start.py --kubeconfig "$("$venv/warren" cluster kubeconfig)" \
  --platform-url "$(cat "$records/url")" --api-key-file "$records/api-key" \
  --partial "$WARREN_HOME/throw-away.json" "$@"
