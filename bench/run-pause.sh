#!/usr/bin/env bash
# `make bench-pause`: bench/pause.py against the platform `make deploy` deployed here (its
# edge and its first API key); refuses, saying so, when nothing is deployed. Writes
# bench/results/pause.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
records=${WARREN_HOME:-/var/lib/warren}/cluster/control-plane
if [[ ! -s $records/url || ! -s $records/api-key ]]; then
  echo "bench-pause: no deployed platform here ($records/url and api-key are missing): run make deploy first" >&2
  exit 1
fi
kubeconfig=$(.venv/bin/warren cluster kubeconfig)
exec .venv/bin/python bench/pause.py --url "$(cat "$records/url")" --api-key-file "$records/api-key" \
  --kubeconfig "$kubeconfig" "$@"
