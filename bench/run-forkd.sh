#!/usr/bin/env bash
# `make bench-forkd`: warren-forkd's mechanics with real QEMU (TCG unless WARREN_FORKD_ACCEL=kvm):
# a template cold-booted to agent-ready, snapshotted, then N children branched from it for each N
# in WARREN_BENCH_FORKD_COUNTS (1,8,32). Writes bench/results/forkd.json: cold_boot_ms,
# snapshot_ms, branch_ms and branch_total_ms and child_pss_mib keyed by N, parent_pss_mib, the
# issue's two acceptance ratios computed from this same run, and the machine they come from.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
forkd=$PWD/packages/warren-forkd/.venv/bin
"$forkd/warren-forkd" bench --counts "${WARREN_BENCH_FORKD_COUNTS:-1,8,32}" \
  --mem-mib "${WARREN_BENCH_FORKD_MEM_MIB:-256}" --out bench/results/forkd.json "$@"
