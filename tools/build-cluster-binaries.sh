#!/usr/bin/env bash
# Build the local cluster's binaries (etcd, Kubernetes, kwok, gVisor, CoreDNS, crictl,
# containerd)
# from the pinned wrapper modules in tools/ into a cache directory keyed by those pins.
#
#   tools/build-cluster-binaries.sh          build if needed, print the bin dir
#
# The cache lives under WARREN_CACHE (default ~/.cache/warren):
#   $WARREN_CACHE/go/mod     GOMODCACHE
#   $WARREN_CACHE/go/build   GOCACHE
#   $WARREN_CACHE/src        patched copies of modules (gVisor, Kubernetes)
#   $WARREN_CACHE/bin/<key>  binaries + SHA256SUMS; <key> hashes every go.mod,
#                            go.sum, patch, this script and the Go version
# A current cache returns at once; a changed pin builds a new key.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WARREN_CACHE:-$HOME/.cache/warren}
export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS=-mod=mod
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}

modules=(kubernetes etcd kwok gvisor coredns cri-tools containerd)
key=$( { go env GOVERSION; cat "$here"/build-cluster-binaries.sh;
         for m in "${modules[@]}"; do cat "$here/$m/go.mod" "$here/$m/go.sum"; done;
         cat "$here"/gvisor/patches/*.patch "$here"/kubernetes/patches/*.patch; } \
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
tmp=$out.partial
rm -rf "$tmp" && mkdir -p "$tmp"
start=$SECONDS

k8s=$(version_of kubernetes k8s.io/kubernetes)
etcd=$(version_of etcd go.etcd.io/etcd/server/v3)
kwok=$(version_of kwok sigs.k8s.io/kwok)
gvisor=$(version_of gvisor gvisor.dev/gvisor)
coredns=$(version_of coredns github.com/coredns/coredns)
critools=$(version_of cri-tools sigs.k8s.io/cri-tools)
containerd=$(version_of containerd github.com/containerd/containerd/v2)
minor=${k8s#v1.}; minor=${minor%%.*}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

log "etcd $etcd"
(cd "$here/etcd" && go build -trimpath -o "$tmp/etcd" \
  -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd" go.etcd.io/etcd/server/v3)

log "kwok $kwok"
(cd "$here/kwok" && go build -trimpath -o "$tmp/kwok" \
  -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok#v}" sigs.k8s.io/kwok/cmd/kwok)

# A module with patches of ours (tools/NAME/patches, each says why) is built from a patched
# copy of it, which a throw-away copy of the wrapper module points at.
patched_wrapper() {  # patched_wrapper NAME MODULE VERSION -> the throw-away wrapper's dir
  local name=$1 module=$2 version=$3 src dir wrapper
  src=$cache/src/$name-$version-$(cat "$here/$name"/patches/*.patch | sha256sum | cut -c1-12)
  if [[ ! -f $src/.patched ]]; then
    rm -rf "$cache/src/$name"-* && mkdir -p "$(dirname "$src")"  # older pins' copies too
    dir=$(cd "$here/$name" && go mod download "$module" && go list -m -f '{{.Dir}}' "$module")
    [[ -d $dir ]] || { echo "module $module $version not found after download" >&2; exit 1; }
    cp -r "$dir" "$src"
    chmod -R u+w "$src"
    for p in "$here/$name"/patches/*.patch; do patch -s -d "$src" -p1 < "$p"; done
    touch "$src/.patched"
  fi
  wrapper=$(mktemp -d)
  cp "$here/$name"/go.mod "$here/$name"/go.sum "$wrapper"/
  echo "replace $module => $src" >> "$wrapper/go.mod"
  echo "$wrapper"
}

# runsc and its containerd shim must come from the same gVisor commit.
log "gvisor $gvisor (+ $(ls "$here"/gvisor/patches | wc -l) patch(es))"
gvisor_mod=$(patched_wrapper gvisor gvisor.dev/gvisor "$gvisor")
(cd "$gvisor_mod" && go build -trimpath -o "$tmp/runsc" \
  -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$gvisor" gvisor.dev/gvisor/runsc)
(cd "$gvisor_mod" && go build -trimpath -o "$tmp/containerd-shim-runsc-v1" \
  -ldflags "-s -w" gvisor.dev/gvisor/shim)
rm -rf "$gvisor_mod"

log "coredns $coredns"
(cd "$here/coredns" && go build -trimpath -o "$tmp/coredns" \
  -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns" github.com/coredns/coredns)

log "containerd $containerd"
(cd "$here/containerd" && go build -trimpath -tags no_btrfs -o "$tmp/" \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr)

log "crictl $critools"
(cd "$here/cri-tools" && go build -trimpath -o "$tmp/crictl" \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$critools" sigs.k8s.io/cri-tools/cmd/crictl)

# One `go build` for all Kubernetes commands so shared packages compile once.
log "kubernetes $k8s (+ $(ls "$here"/kubernetes/patches | wc -l) patch(es); the longest part: 6-8 minutes on 2 cores when cold)"
vflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  vflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  vflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done
k8s_mod=$(patched_wrapper kubernetes k8s.io/kubernetes "$k8s")
(cd "$k8s_mod" && go build -trimpath -o "$tmp/" -ldflags "-s -w$vflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl)
rm -rf "$k8s_mod"

(cd "$tmp" && sha256sum -- * > ../SHA256SUMS.tmp) && mv "$tmp/../SHA256SUMS.tmp" "$tmp/SHA256SUMS"
printf 'kubernetes=%s\netcd=%s\nkwok=%s\ngvisor=%s\ncoredns=%s\ncri-tools=%s\ncontainerd=%s\nbuilt=%s\nseconds=%s\n' \
  "$k8s" "$etcd" "$kwok" "$gvisor" "$coredns" "$critools" "$containerd" "$build_date" "$((SECONDS - start))" \
  > "$tmp/PINS"
rm -rf "$out" && mv "$tmp" "$out"
log "done in $((SECONDS - start)) s"
echo "$out"
