#!/usr/bin/env bash
# `make bench-exec`, `make bench-pause`: bench/NAME.py against the platform `make deploy`
# deployed here (its edge and its first API key); refuses, saying so, when nothing is
# deployed. Each writes bench/results/NAME.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
name=${1:?usage: bench/run-deployed.sh exec|pause [ARGS...]}
shift
records=${WARREN_HOME:-/var/lib/warren}/cluster/control-plane
if [[ ! -s $records/url || ! -s $records/api-key ]]; then
  echo "bench-$name: no deployed platform here ($records/url and api-key are missing): run make deploy first" >&2
  exit 1
fi
kubeconfig=$(.venv/bin/warren cluster kubeconfig)
exec .venv/bin/python "bench/$name.py" --url "$(cat "$records/url")" --api-key-file "$records/api-key" \
  --kubeconfig "$kubeconfig" "$@"
