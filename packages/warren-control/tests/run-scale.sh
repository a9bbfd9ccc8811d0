#!/usr/bin/env bash
# The controller's scale test: a throw-away control plane (etcd, kube-apiserver,
# kube-scheduler) with kwok's simulated nodes, on free loopback ports and in a temporary
# directory, so it runs beside a local cluster. Builds (or finds) the binaries first.
# Extra arguments go to pytest; WARREN_SCALE_NODES / WARREN_SCALE_SANDBOXES shrink the run.
set -euo pipefail
package=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo=$(cd "$package/../.." && pwd)

if [[ -z ${WARREN_BIN_DIR:-} ]]; then
  WARREN_BIN_DIR=$("$repo/tools/build-cluster-binaries.sh")
  export WARREN_BIN_DIR
fi

cd "$package"
# -rfEP: the measured rates are printed by the test; show them for a passing run too, and
# end with a failure's one-line reason, after its output.
.venv/bin/pytest -m scale -rfEP "$@"
