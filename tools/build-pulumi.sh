#!/usr/bin/env bash
# Build the Pulumi CLI, its Python language host and the Pulumi Kubernetes provider from
# the pinned wrapper modules in tools/ into a cache directory keyed by those pins, so that
# `pulumi up` runs with every plugin on PATH and nothing to download.
#
#   tools/build-pulumi.sh          build if needed, print the bin dir
#
# The cache is the one build-cluster-binaries.sh uses (WARREN_CACHE, default ~/.cache/warren):
#   $WARREN_CACHE/go/mod     GOMODCACHE
#   $WARREN_CACHE/go/build   GOCACHE
#   $WARREN_CACHE/src        the provider's module with its generated files
#   $WARREN_CACHE/bin/<key>  binaries + SHA256SUMS + PINS; <key> hashes every go.mod,
#                            go.sum, this script and the Go version
# A current cache returns at once; a changed pin builds a new key.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WARREN_CACHE:-$HOME/.cache/warren}
export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS=-mod=mod
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}

modules=(pulumi pulumi-language-python pulumi-kubernetes)
key=$( { go env GOVERSION; cat "$here"/build-pulumi.sh;
         for m in "${modules[@]}"; do cat "$here/$m/go.mod" "$here/$m/go.sum"; done; } \
       | sha256sum | cut -c1-16)
out=$cache/bin/$key
built() { [[ -f $out/SHA256SUMS ]] && (cd "$out" && sha256sum --quiet -c SHA256SUMS); }
if built; then echo "$out"; exit 0; fi
# One build per key: a second caller (make test's lanes ask at once) waits for the first
# and takes its result.
mkdir -p "$cache/bin" && exec 9> "$out.lock"
if ! flock -n 9; then
  echo "[build] waiting for the build of the same pins already running ($out.lock)" >&2
  flock 9
fi
if built; then echo "$out"; exit 0; fi

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
version_of() {  # version_of DIR MODULE -> the version the wrapper pins
  (cd "$here/$1" && go list -m -f '{{.Version}}' "$2")
}
dir_of() {  # dir_of DIR MODULE -> the module's (read-only) source in GOMODCACHE
  (cd "$here/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
}
tmp=$out.partial
rm -rf "$tmp" && mkdir -p "$tmp"
start=$SECONDS
took=""  # per-binary seconds, for PINS

pulumi=$(version_of pulumi github.com/pulumi/pulumi/pkg/v3)
langhost=$(version_of pulumi-language-python github.com/pulumi/pulumi/sdk/v3)
k8s_provider=$(version_of pulumi-kubernetes github.com/pulumi/pulumi-kubernetes/provider/v4)
# The provider reports the version of the SDK tag the wrapper pins (the commit is served
# only as a pseudo-version); the Python SDK pinned from PyPI must be that same version.
k8s=$(version_of pulumi-kubernetes github.com/pulumi/pulumi-kubernetes/sdk/v4); k8s=${k8s#v}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

log "pulumi $pulumi"
t=$SECONDS
(cd "$here/pulumi" && go build -trimpath -o "$tmp/pulumi" \
  -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$pulumi" \
  github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
took+=" pulumi=$((SECONDS - t))"

# The host's own module is not served, so it comes from the newest sdk/v3 that still
# carried it. It runs the program through pulumi-language-python-exec, found on PATH;
# that script goes with the Python SDK, so it is the CLI's (the CLI's sdk/v3).
log "pulumi-language-python $langhost"
t=$SECONDS
(cd "$here/pulumi-language-python" && go build -trimpath -o "$tmp/pulumi-language-python" \
  -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$langhost" \
  github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python)
sdk_dir=$(dir_of pulumi github.com/pulumi/pulumi/sdk/v3)
install -m 0755 "$sdk_dir/python/cmd/pulumi-language-python-exec" "$tmp/"
took+=" pulumi-language-python=$((SECONDS - t))"

# The provider embeds schema-embed.json and terraform-mapping-embed.json, which its
# `go generate` (generate.go) writes with the version stamped in; the module ships without
# them. Generate once into a writable copy, then build it through a throw-away copy of
# the wrapper module that points at the copy with a `replace`.
log "pulumi-resource-kubernetes $k8s ($k8s_provider)"
t=$SECONDS
k8s_src=$cache/src/pulumi-kubernetes-$k8s_provider-$k8s
k8s_mod=$(mktemp -d)
cp "$here"/pulumi-kubernetes/go.mod "$here"/pulumi-kubernetes/go.sum "$k8s_mod"/
echo "replace github.com/pulumi/pulumi-kubernetes/provider/v4 => $k8s_src" >> "$k8s_mod/go.mod"
if [[ ! -f $k8s_src/.generated ]]; then
  rm -rf "$cache"/src/pulumi-kubernetes-* && mkdir -p "$(dirname "$k8s_src")"  # older pins' copies too
  cp -r "$(dir_of pulumi-kubernetes github.com/pulumi/pulumi-kubernetes/provider/v4)" "$k8s_src"
  chmod -R u+w "$k8s_src"
  # -trimpath as below: the generator's packages compile once, for both builds.
  (cd "$k8s_mod" && go build -trimpath -o "$k8s_mod/generate" "$k8s_src/cmd/pulumi-resource-kubernetes/generate.go")
  (cd "$k8s_src/cmd/pulumi-resource-kubernetes" && VERSION=$k8s "$k8s_mod/generate")
  touch "$k8s_src/.generated"
fi
(cd "$k8s_mod" && go build -trimpath -o "$tmp/pulumi-resource-kubernetes" \
  -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$k8s" \
  github.com/pulumi/pulumi-kubernetes/provider/v4/cmd/pulumi-resource-kubernetes)
rm -rf "$k8s_mod"
took+=" pulumi-resource-kubernetes=$((SECONDS - t))"

(cd "$tmp" && sha256sum -- * > ../SHA256SUMS.tmp) && mv "$tmp/../SHA256SUMS.tmp" "$tmp/SHA256SUMS"
printf 'pulumi=%s\npulumi-language-python=%s\npulumi-kubernetes=%s\npulumi-kubernetes-provider=%s\nbuilt=%s\nseconds=%s\nseconds-each=%s\n' \
  "$pulumi" "$langhost" "$k8s" "$k8s_provider" "$build_date" "$((SECONDS - start))" "${took# }" \
  > "$tmp/PINS"
rm -rf "$out" && mv "$tmp" "$out"
log "done in $((SECONDS - start)) s:$took"
echo "$out"
