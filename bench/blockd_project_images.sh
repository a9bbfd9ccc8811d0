#!/usr/bin/env bash
# Two ext4 images holding two builds of one real compiled project, for the warren-blockd
# dedup benchmark (how much of build B is already stored for build A when images are
# chunked along file boundaries versus at fixed offsets).
#
#   bench/blockd_project_images.sh OUT_DIR     (as root: it mounts loop devices)
#
# The project is etcd's server module at the version tools/etcd pins, taken from the Go
# module cache that tools/build-cluster-binaries.sh fills (so a machine that has built
# the cluster binaries needs no network; otherwise the go command fetches what is
# missing). It is copied into a project directory, made self-contained with
# `go mod vendor`, and built with GOCACHE and the binary inside that directory, so the
# tree looks like a developer's checkout after a build: sources, vendored deps,
# compiled package cache, binary (about 400 MB).
#
#   build A  cold build                          -> OUT_DIR/build-a.img
#   build B  one string in etcdmain/help.go      -> OUT_DIR/build-b.img
#            changed, incremental rebuild with
#            the same GOCACHE
#
# Each tree is written by the kernel into its own fresh ext4 image (sparse file,
# mkfs.ext4 with eager inode table and journal init, loop device, mount, cp -a, sync,
# umount, detach).
# Prints the two image paths on stdout and a one-line summary on stderr. About one minute
# on 2 cores with a warm module cache, nearly all of it the cold build of A.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "$0: must run as root (loop mounts)" >&2
  exit 1
fi
for tool in go mkfs.ext4 losetup mount umount; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found" >&2; exit 1; }
done

exec 3>&1 1>&2 # stdout carries only the image paths; everything else goes to stderr
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
cache=${WARREN_CACHE:-$HOME/.cache/warren}
export GOMODCACHE=$cache/go/mod GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOWORK=off CGO_ENABLED=0
module=go.etcd.io/etcd/server/v3
start=$SECONDS

work=$(mktemp -d "${TMPDIR:-/tmp}/blockd-project.XXXXXX")
mnt=$work/mnt
loopdev=""
partial=""
cleanup() {
  local rc=$?
  cd /
  if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || umount -l "$mnt" || true; fi
  if [[ -n $loopdev ]]; then losetup -d "$loopdev" || true; fi
  if [[ -n $partial ]]; then rm -f "$partial"; fi
  rm -rf --one-file-system "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
mib() { echo $((($1 + 1048575) / 1048576)); }

# write_image TREE IMAGE: a fresh ext4 image holding a copy of TREE (made by the kernel).
write_image() {
  local tree=$1 image=$2 used size
  used=$(du -s --block-size=1 "$tree" | cut -f1)
  size=$((used * 3 / 2 + 64 * 1048576))
  size=$(((size + 4095) / 4096 * 4096))
  partial=$image
  rm -f "$image"
  truncate -s "$size" "$image"
  mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 "$image"
  loopdev=$(losetup --find --show "$image")
  mkdir -p "$mnt"
  mount "$loopdev" "$mnt"
  cp -a "$tree" "$mnt/"
  sync
  umount "$mnt"
  losetup -d "$loopdev"
  loopdev=""
  partial=""
}

# The pinned version and its sources, resolved through the wrapper module in tools/etcd
# (offline when the module cache already holds them).
version=$(cd "$here/tools/etcd" && GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$module")
(cd "$here/tools/etcd" && GOFLAGS=-mod=mod GOCACHE=$cache/go/build go list -deps "$module" >/dev/null)
src=$(cd "$here/tools/etcd" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$module")
[[ -d $src ]] || { echo "$0: $module $version not in the module cache" >&2; exit 1; }
log "etcd server $version: copy, vendor"

project=$work/etcd
cp -r "$src" "$project"
chmod -R u+w "$project"
cd "$project"
# The published go.mod points its sibling modules at ../api etc. (etcd's monorepo); use the
# versions the module requires instead, with the checksums the wrapper module recorded.
awk '/^replace \($/ {skip = 1; next} skip && /^\)$/ {skip = 0; next} skip {next}
     /^replace / {next} {print}' go.mod > go.mod.new && mv go.mod.new go.mod
sort -u go.sum "$here/tools/etcd/go.sum" -o go.sum
# -e: packages only tests or other systems import may be absent from the offline cache;
# the build below fails loudly if anything it needs is missing.
GOFLAGS=-mod=mod GOPROXY=off go mod vendor -e 2> "$work/vendor.log" || { cat "$work/vendor.log"; exit 1; }

export GOCACHE=$project/.cache/go-build GOFLAGS=-mod=vendor
build() { go build -trimpath -o bin/etcd . || { cat "$work/vendor.log"; exit 1; }; }

log "build A (cold)"
t=$SECONDS
build
secs_a=$((SECONDS - t))
tree_a=$(du -s --block-size=1 "$project" | cut -f1)
files_a=$(find "$project" -type f | wc -l)
log "build A: $(mib "$tree_a") MiB, $files_a files, ${secs_a}s; writing build-a.img"
write_image "$project" "$out/build-a.img"

# The small change: one word of the usage text in etcdmain, the package etcd's main.go
# says to modify. Only etcdmain recompiles (its export data is unchanged) and the binary
# relinks.
sed -i 's/Show the version of etcd\./Show the version of etcd and exit./' etcdmain/help.go
grep -qF 'Show the version of etcd and exit.' etcdmain/help.go ||
  { echo "$0: etcdmain/help.go no longer has the line this script changes" >&2; exit 1; }

log "build B (incremental)"
t=$SECONDS
build
secs_b=$((SECONDS - t))
tree_b=$(du -s --block-size=1 "$project" | cut -f1)
files_b=$(find "$project" -type f | wc -l)
log "build B: $(mib "$tree_b") MiB, $files_b files, ${secs_b}s; writing build-b.img"
write_image "$project" "$out/build-b.img"

img_a=$(stat -c %s "$out/build-a.img")
img_b=$(stat -c %s "$out/build-b.img")
alloc_a=$(du -s --block-size=1 "$out/build-a.img" | cut -f1)
alloc_b=$(du -s --block-size=1 "$out/build-b.img" | cut -f1)
echo "blockd_project_images: etcd server $version;" \
  "A tree $(mib "$tree_a") MiB ($files_a files, build ${secs_a}s) image $(mib "$img_a") MiB ($(mib "$alloc_a") MiB allocated);" \
  "B tree $(mib "$tree_b") MiB ($files_b files, build ${secs_b}s) image $(mib "$img_b") MiB ($(mib "$alloc_b") MiB allocated);" \
  "total $((SECONDS - start))s"
printf '%s\n' "$out/build-a.img" "$out/build-b.img" >&3
