#!/usr/bin/env bash
# Print the test/testdata directory of k8s.io/pod-security-admission at the version the
# pinned Kubernetes uses (Kubernetes' own Pod Security corpus, for the conformance suite),
# downloading the module into the documented cache if it is not there yet.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WARREN_CACHE:-$HOME/.cache/warren}
export GOMODCACHE=$cache/go/mod GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}
module=k8s.io/pod-security-admission
version=$(sed -n "s|^[[:space:]]*$module => $module \(v[0-9.]*\)$|\1|p" "$here/kubernetes/go.mod")
[[ -n $version ]] || { echo "no replace line for $module in $here/kubernetes/go.mod" >&2; exit 1; }
dir=$(cd / && go mod download -json "$module@$version" | sed -n 's|^[[:space:]]*"Dir": "\(.*\)",$|\1|p')
[[ -d $dir/test/testdata ]] || { echo "$module@$version has no test/testdata" >&2; exit 1; }
echo "$dir/test/testdata"
