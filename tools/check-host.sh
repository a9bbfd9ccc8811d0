#!/usr/bin/env bash
# Install (as root, through apt) the few host tools the build and tests call, and check
# the toolchains the project cannot install by itself.
set -euo pipefail
# tool -> Debian package, for the build, the local node and the tests.
declare -A packages=(
  [ip]=iproute2 [make]=make [sha256sum]=coreutils [patch]=patch [gcc]=gcc
  [runc]=runc [nft]=nftables [iptables]=iptables
  [conntrack]=conntrack [/bin/busybox]=busybox-static [/usr/lib/cni/bridge]=containernetworking-plugins
  # warren-blockd: the FUSE-served device, loop devices and ext4.
  [fusermount3]=fuse3 [mkfs.ext4]=e2fsprogs [debugfs]=e2fsprogs [losetup]=mount
  [fsfreeze]=util-linux [setpriv]=util-linux [findmnt]=util-linux
  # warren-forkd: the microVMs and their overlay disks (gcc above builds the guest's reseed helper).
  [qemu-system-x86_64]=qemu-system-x86 [qemu-img]=qemu-utils
  # warren-control: its tests start a real PostgreSQL server.
  [/usr/lib/postgresql]=postgresql
  # warren bundle build: the index of the bundle's local apt repository.
  [dpkg-scanpackages]=dpkg-dev
  # warren image build: the services' Debian userland; warren image push and its test's
  # registry on loopback.
  [mmdebstrap]=mmdebstrap [skopeo]=skopeo [docker-registry]=docker-registry
  # sshd: Ansible reaches hosts over SSH (make hosts-test runs one per namespace host;
  # the package's own service is not started).
  [/usr/sbin/sshd]=openssh-server
)
need=()
for tool in "${!packages[@]}"; do
  if [[ $tool == /* ]]; then [[ -e $tool ]] || need+=("${packages[$tool]}")
  else command -v "$tool" >/dev/null || need+=("${packages[$tool]}"); fi
done
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing host packages: ${need[*]} (install them, or run as root)" >&2
    exit 1
  fi
  # Packages install their files only: no service they ship (sshd, PostgreSQL) is started.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
go_version=$(go env GOVERSION 2>/dev/null || true)
if [[ ! $go_version =~ ^go1\.(2[6-9]|[3-9][0-9]) ]]; then
  echo "Go 1.26 or newer is needed to build the cluster binaries (found: ${go_version:-none})." >&2
  echo "Install it, or export GOTOOLCHAIN=go1.26.8 to let the go command fetch it." >&2
  exit 1
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "Python 3.11 or newer is needed (found: $(python3 --version 2>&1))." >&2
  exit 1
}
# The test cluster's kubelet evicts every pod once its disk has less than 5% free (its
# evictionHard), and a run writes about 15 GiB of images, root filesystems and workspaces
# while it goes: refuse to start a run that would end in evictions.
check_disk() {
  local dir=$1 size free need
  until [[ -e $dir ]]; do dir=$(dirname "$dir"); done
  read -r size free < <(df -P -B1G "$dir" | awk 'NR == 2 {print $2, $4}')
  need=$(( size * 5 / 100 + 15 ))
  if (( free < need )); then
    echo "only ${free} GiB free on the disk holding $dir (of ${size} GiB); a run needs ${need} GiB:" >&2
    echo "the 15 GiB it writes, above the 5% at which the kubelet evicts pods. Free some space" >&2
    echo "(old test scratch under ${TMPDIR:-/tmp}/pytest-of-$(id -un), unused caches) and run it again." >&2
    exit 1
  fi
}
check_disk "${TMPDIR:-/tmp}"
check_disk "${WARREN_CACHE:-$HOME/.cache/warren}"
