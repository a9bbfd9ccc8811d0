# Warren: the two commands a fresh machine needs are `make deploy` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export WARREN_CACHE ?= $(HOME)/.cache/warren
# Python keeps the bytecode it compiles: in an environment that says otherwise
# (PYTHONDONTWRITEBYTECODE), every CLI call and test process would compile its thousand
# modules again, over two seconds each on two cores.
unexport PYTHONDONTWRITEBYTECODE
# The environments' packages are installed with uv (pinned; kept in the cache by its version):
# from its cache an environment takes seconds where pip takes most of a minute. Each venv is
# still Python's own (`-m venv`, with the pip it ships), which the bundle builder runs.
UV_VERSION := 0.13.8
UV := $(WARREN_CACHE)/tools/uv-$(UV_VERSION)/bin/uv
INSTALL = $(UV) pip install --quiet --python
# mypy's incremental cache, one per checked tree, kept in the cache: a clean clone then checks
# only what changed (mypy validates its cache by the files' contents and its own version).
mypy = MYPY_CACHE_DIR=$(WARREN_CACHE)/mypy/$(1)

.PHONY: deploy down test lint unit blockd control cluster-test scale binaries venv clean bench-runtime bench-blockd bench-blockd-fuse bench-control bench-workspace pulumi-unit pulumi-test ansible-test
BLOCKD := packages/warren-blockd
CONTROL := packages/warren-control
FORKD := packages/warren-forkd
COMMON := packages/warren-common
PULUMI := components

## The host packages the build, the node and the tests use (apt, as root), and the toolchains'
## versions checked.
.PHONY: host
host:
	tools/check-host.sh

$(UV):
	$(PYTHON) -m venv $(WARREN_CACHE)/tools/uv-$(UV_VERSION)
	$(WARREN_CACHE)/tools/uv-$(UV_VERSION)/bin/pip install --quiet uv==$(UV_VERSION)

venv: $(VENV)/.installed $(VENV)/.control-installed
$(VENV)/.installed: pyproject.toml $(COMMON)/pyproject.toml | $(UV)
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) $(BIN)/python -e '$(COMMON)' -e '.[ansible,conformance,dev]'
	touch $@

# `warren control-plane` and `warren sandbox` run the control plane's own code, so this
# environment holds warren-control too (its pins agree with the warren package's).
$(VENV)/.control-installed: $(VENV)/.installed $(CONTROL)/pyproject.toml $(COMMON)/pyproject.toml
	$(INSTALL) $(BIN)/python -e '$(COMMON)[kubecluster]' -e '$(CONTROL)'
	touch $@

## Build (or reuse from $(WARREN_CACHE)) etcd, Kubernetes and kwok from the pins in tools/.
binaries:
	tools/build-cluster-binaries.sh

## The main job: the whole platform on this machine through Ansible (playbooks/site.yml with
## the local inventory): the local cluster with the isolation floor and the platform's
## objects, and Warren's own services as workloads in warren-system (the control plane, the
## workspace daemon with its CSI plugin, the object store and the database) from images built
## here and imported into the node. It ends by printing the API endpoint and where its first
## API key is.
# The host's own packages first (tools/check-host.sh, through apt as root), so that a fresh
# machine needs nothing run before this.
deploy: host venv $(BLOCKD)/.venv/.installed
	bin_dir=$$(tools/build-cluster-binaries.sh); \
	WARREN_BIN_DIR="$$bin_dir" ANSIBLE_CONFIG=$(CURDIR)/ansible.cfg \
	  $(BIN)/ansible-playbook -i inventories/local/hosts.yml playbooks/site.yml

down: venv
	$(BIN)/warren cluster down

## Every test tier CI runs: lint, unit, pulumi-unit (components under Pulumi's mocks, the
## policy pack's rules), pulumi-test (a real `pulumi up`/`destroy` of the local stack, its
## objects identical to the Ansible path's; the policy pack refusing at `pulumi preview`),
## blockd (unit + real SeaweedFS, FUSE, ext4), forkd (real QEMU microVMs under TCG: boot,
## snapshot, 8 children with distinct entropy and disks), agent (the in-sandbox agent driven
## by the pinned E2B SDK's envd clients), ansible-test (roles converged on this machine:
## PostgreSQL's, with rotation, idempotence and check mode), control (records on real
## PostgreSQL and SQLite, the edge against a local OIDC issuer), bundle-test (the air-gapped
## bundle installed with no network), hosts-test (site.yml from that bundle onto three
## namespace hosts over SSH, no route out), cluster (the platform deployed as `make deploy`
## does, Warren's services as workloads; conformance with the platform tier through the
## edge, the workloads' rollout, the control plane and workspaces against a real API server
## and a real gVisor node), images-test (the service images run, rebuilt to the same
## digests, pushed to a real registry), scale (the controller on 1,000 kwok nodes with 5,000
## sandboxes).
# Three lanes side by side on two cores: with two, a quarter of the CPU sat idle while the
# lanes' tiers waited on pods, rollouts, SSH round trips and downloads. The cluster tier,
# the longest, has a lane of its own; the bundle (built once), the two tiers that install it,
# the tiers that converge hosts and stacks and the controller at scale take the second; lint,
# unit and the packages' tiers, at a lower CPU priority (nice), the third (with scale too it
# ended last on a warm cache, three minutes after the cluster tier). Every tier uses its own ports,
# directories and namespaces (the hosts tier's hosts are namespaces with their own Warren
# paths), so the lanes share nothing but the environments and the binaries (each built once,
# whichever asks first; see builds below). Each line is prefixed with its tier; test-results/tiers/ keeps every tier's log; the
# end prints each tier's time and result, and a failed tier's last lines again.
TIERS_CLUSTER := cluster-test
TIERS_BUNDLE := ansible-test bundle bundle-test hosts-test pulumi-test scale nodes-test
TIERS_REST := check pulumi-unit blockd forkd agent control images-test
REST_NICE := 5
TIER_LOGS := test-results/tiers
ENVS := $(VENV)/.installed $(VENV)/.control-installed $(BLOCKD)/.venv/.installed $(CONTROL)/.venv/.installed \
  $(FORKD)/.venv/.installed $(PULUMI)/.venv/.installed
test:
	$(MAKE) -j4 $(ENVS)
	rm -rf $(TIER_LOGS) && mkdir -p $(TIER_LOGS)
	$(MAKE) -j4 build-pulumi lane-cluster lane-bundle lane-rest || { \
	  for failed in $(TIER_LOGS)/*.failed; do \
	    tier=$$(basename "$$failed" .failed); \
	    echo "=== tier $$tier failed; its last lines ($(TIER_LOGS)/$$tier.log):"; \
	    tail -n 80 "$(TIER_LOGS)/$$tier.log"; \
	  done; $(MAKE) -s tier-times; exit 1; }
	$(MAKE) -s tier-times

.PHONY: tier-times
tier-times:
	@echo "=== each tier's time, by lane:"
	@awk '{printf "%-13s %-13s %6d s  %s\n", $$1, $$2, $$3, $$4}' $(TIER_LOGS)/times

# On a cold cache the Go builds are most of the run's CPU, so each lane starts as soon as
# what it needs is built: the packages' lane at once (it needs no Go build until its last
# tiers, whose scripts wait for the build in progress), the cluster and bundle lanes once the
# cluster binaries are (their first tiers need them), and Pulumi's build after those, beside
# the lanes (only the bundle and pulumi-test need it; they wait for it the same way).
.PHONY: builds build-binaries build-pulumi lane-cluster lane-bundle lane-rest
builds: build-binaries build-pulumi
build-binaries:
	tools/build-cluster-binaries.sh >/dev/null
build-pulumi: build-binaries
	tools/build-pulumi.sh >/dev/null
lane-cluster lane-bundle: build-binaries

# The bundle is built once, as a tier of its own, for the two tiers after it that install it
# (BUNDLE_WAIT: they take that build, or fail at once if it failed).
lane-cluster:
	$(call lane,$(TIERS_CLUSTER))
lane-bundle:
	$(call lane,$(TIERS_BUNDLE),BUNDLE_WAIT=1)
lane-rest:
	$(call lane,$(TIERS_REST),CHECKED=1,nice -n $(REST_NICE))
# A failed tier does not stop its lane: one run reports every tier.
define lane
failed=0; \
for tier in $(1); do \
  start=$$SECONDS; \
  if $(3) $(MAKE) -j1 $$tier $(2) 2>&1 | tee $(TIER_LOGS)/$$tier.log | sed -u "s/^/[$$tier] /"; then \
    echo "tier $$tier: $$((SECONDS - start)) s"; touch $(TIER_LOGS)/$$tier.passed; result=passed; \
  else \
    echo "tier $$tier: FAILED after $$((SECONDS - start)) s"; touch $(TIER_LOGS)/$$tier.failed; failed=1; result=FAILED; \
  fi; \
  echo "$@ $$tier $$((SECONDS - start)) $$result" >> $(TIER_LOGS)/times; \
done; \
exit $$failed
endef

## The fast lane, in a few minutes with no root: lint, types, the unit tests and each
## package's tests that need no root and start no service (no SeaweedFS, PostgreSQL, QEMU
## or cluster). Run as root, it drops every capability first, so it proves it needs none.
NOPRIV := $(if $(filter 0,$(shell id -u)),setpriv --bounding-set=-all --inh-caps=-all --no-new-privs)
.PHONY: check check-types check-tests
check: venv $(BLOCKD)/.venv/.installed $(CONTROL)/.venv/.installed $(FORKD)/.venv/.installed
	$(NOPRIV) $(MAKE) -j2 check-types check-tests
check-types: lint
	cd $(BLOCKD) && $(call mypy,blockd) .venv/bin/mypy
	cd $(FORKD) && $(call mypy,forkd) .venv/bin/mypy
	cd $(CONTROL) && $(call mypy,control) .venv/bin/mypy
check-tests: unit
	cd $(BLOCKD) && .venv/bin/pytest -q -m "not root and not integration"
	cd $(FORKD) && .venv/bin/pytest -q -m "not integration"
	cd $(CONTROL) && .venv/bin/pytest -q -m "not integration and not cluster and not scale"

# After `make check` (`make test` runs it first, CHECKED=1) a package's tier runs only what
# the check left out.
BLOCKD_TESTS := $(if $(CHECKED),-m "root or integration")
FORKD_TESTS := $(if $(CHECKED),-m integration)
CONTROL_TESTS := $(if $(CHECKED),-m "integration and not cluster and not scale",-m "not cluster and not scale")
TYPES = $(if $(CHECKED),true,$(call mypy,$(1)) .venv/bin/mypy)

lint: venv
	$(BIN)/ruff check src tests packages bench components infra policy agent plugins
	$(BIN)/ruff format --check src tests packages bench components infra policy agent plugins
	$(call mypy,root) $(BIN)/mypy
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/ansible-lint

unit: venv
	$(BIN)/pytest tests/unit
	cd $(COMMON) && $(call mypy,common) $(CURDIR)/$(BIN)/mypy && $(CURDIR)/$(BIN)/pytest

# Warren's roles applied to this machine with ansible-playbook (as root), each against
# temporary directories and ports, its services under Warren's supervisor.
ansible-test: venv
	$(BIN)/pytest -m ansible tests/ansible

# Each package has its own environment: boto3's and kubernetes' pins cannot share one.
# blockd's CSI stubs are generated here (git-ignored) from the .proto files of the Go
# modules the pinned Kubernetes uses.
$(BLOCKD)/.venv/.installed: $(BLOCKD)/pyproject.toml $(COMMON)/pyproject.toml tools/blockd-protos.sh tools/kubernetes/go.mod | $(UV)
	$(PYTHON) -m venv $(BLOCKD)/.venv
	$(INSTALL) $(BLOCKD)/.venv/bin/python -e '$(COMMON)' -e '$(BLOCKD)[test,codegen]'
	tools/blockd-protos.sh $(BLOCKD)/.venv/bin/python
	touch $@

blockd: $(BLOCKD)/.venv/.installed
	cd $(BLOCKD) && $(call TYPES,blockd) && .venv/bin/pytest $(BLOCKD_TESTS)

# warren-forkd: the daemon (HTTP on a unix socket) that boots a QEMU microVM template (TCG
# here), snapshots it and branches children that share its memory copy-on-write.
$(FORKD)/.venv/.installed: $(FORKD)/pyproject.toml $(COMMON)/pyproject.toml | $(UV)
	$(PYTHON) -m venv $(FORKD)/.venv
	$(INSTALL) $(FORKD)/.venv/bin/python -e '$(COMMON)' -e '$(FORKD)[test]'
	touch $@

.PHONY: forkd
forkd: $(FORKD)/.venv/.installed
	cd $(FORKD) && $(call TYPES,forkd) && .venv/bin/pytest $(FORKD_TESTS)

# The in-sandbox agent (agent/, Go, standard library only): a static binary speaking E2B's
# envd protocol. Its Go tests, then the pinned E2B SDK driving the built binary on a loopback
# port (agent/.venv from agent/requirements.txt).
AGENT := agent
AGENT_GO := GOMODCACHE=$(WARREN_CACHE)/go/mod GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

$(AGENT)/.venv/.installed: $(AGENT)/requirements.txt | $(UV)
	$(PYTHON) -m venv $(AGENT)/.venv
	$(INSTALL) $(AGENT)/.venv/bin/python -r $(AGENT)/requirements.txt
	touch $@

.PHONY: agent
agent: $(AGENT)/.venv/.installed
	cd $(AGENT) && test -z "$$(gofmt -l .)" || { gofmt -l . >&2; echo "agent: run gofmt -w on these" >&2; exit 1; }
	cd $(AGENT) && $(AGENT_GO) go vet ./... && $(AGENT_GO) go test ./...
	cd $(AGENT) && $(AGENT_GO) go build -trimpath -ldflags "-s -w" -o bin/agent .
	cd $(AGENT) && WARREN_AGENT_BIN=$(CURDIR)/$(AGENT)/bin/agent .venv/bin/pytest

$(CONTROL)/.venv/.installed: $(CONTROL)/pyproject.toml $(COMMON)/pyproject.toml | $(UV)
	$(PYTHON) -m venv $(CONTROL)/.venv
	$(INSTALL) $(CONTROL)/.venv/bin/python -e '$(COMMON)[test,kubecluster]' -e '$(CONTROL)[test]'
	touch $@

# The controller's tests against a live cluster run in the cluster tier (tests/cluster/run.sh);
# its scale test with kwok nodes runs on its own ($(CONTROL)/tests/run-scale.sh).
control: $(CONTROL)/.venv/.installed $(BLOCKD)/.venv/.installed
	cd $(CONTROL) && $(call TYPES,control) && .venv/bin/pytest $(CONTROL_TESTS)

# The controller at scale: 1,000 kwok nodes and 5,000 sandboxes to Running and deleted again,
# on a throw-away control plane of its own (no root, no real node).
scale: venv $(CONTROL)/.venv/.installed
	$(CONTROL)/tests/run-scale.sh

cluster-test: venv $(CONTROL)/.venv/.installed $(BLOCKD)/.venv/.installed
	tests/cluster/run.sh

# Two joined nodes of one local cluster, each in network and mount namespaces of its own:
# gVisor pods on both, the network between them, the egress floor on each, a clean teardown.
.PHONY: nodes-test
nodes-test: venv
	tests/nodes/run.sh

# The Pulumi side (components/, infra/, policy/) has an environment of its own: the Pulumi SDKs
# (pinned in components/pyproject.toml) beside the warren package, which WarrenPlatform renders
# with. infra/Pulumi.yaml and policy/PulumiPolicy.yaml name this environment too.
$(PULUMI)/.venv/.installed: pyproject.toml $(PULUMI)/pyproject.toml $(COMMON)/pyproject.toml | $(UV)
	$(PYTHON) -m venv $(PULUMI)/.venv
	$(INSTALL) $(PULUMI)/.venv/bin/python -e '$(COMMON)[kubecluster]' -e . -e '$(PULUMI)[policy,test]'
	touch $@

# Unit tests with Pulumi's mocks (no CLI, no cloud, no cluster) and the policy pack's rules.
# mypy runs here, not in `lint`: it needs the Pulumi SDKs. Each __main__.py is checked alone.
pulumi-unit: $(PULUMI)/.venv/.installed
	cd $(PULUMI) && $(call mypy,components) .venv/bin/mypy warren_components ../tests/pulumi ../tests/pulumi_cluster
	cd $(PULUMI) && $(call mypy,infra) .venv/bin/mypy ../infra
	cd $(PULUMI) && $(call mypy,policy) .venv/bin/mypy ../policy
	$(PULUMI)/.venv/bin/pytest tests/pulumi

# A real `pulumi up`, preview and destroy of the `local` stack (file backend; the CLI, Python
# language host and Kubernetes provider built from Go modules) and the Ansible admission role,
# on a throw-away etcd + kube-apiserver (+ namespace and garbage collection controllers) of
# their own: both paths must make identical objects. Also the policy pack under the real CLI
# (test_policy_pack.py, no cluster): `pulumi preview --policy-pack policy/analyzer` refuses
# violating objects and passes compliant ones and the local stack.
# The main environment runs ansible-playbook and warren.
.PHONY: pulumi-test
pulumi-test: venv $(PULUMI)/.venv/.installed
	pulumi_bin=$$(tools/build-pulumi.sh); cluster_bin=$$(tools/build-cluster-binaries.sh); \
	WARREN_PULUMI_BIN_DIR="$$pulumi_bin" WARREN_BIN_DIR="$$cluster_bin" \
	  $(PULUMI)/.venv/bin/pytest -m pulumi -rP tests/pulumi_cluster

## The air-gapped bundle (docs/air-gapped.md): wheels, Debian packages, the Go binaries and
## the images in one archive. Slow parts are cached under $(WARREN_CACHE)/bundle.
.PHONY: bundle bundle-test
BUNDLE ?= dist/warren-bundle.tar.gz
bundle: venv
	$(BIN)/warren bundle build --output $(BUNDLE)

# An install from that bundle inside a network namespace with only loopback (as root):
# three environments from its wheels, apt from its repository alone, its binaries and
# images.
# BUNDLE_PREBUILT=1: use $(BUNDLE) as it is (make test builds it once for both tiers).
# BUNDLE_WAIT=1: wait for the bundle tier of the other lane to end (make test's lanes).
BUNDLE_DEP := $(if $(BUNDLE_WAIT),bundle-ready,$(if $(BUNDLE_PREBUILT),,bundle))
BUNDLE_WAIT_S := 3600
.PHONY: bundle-ready
bundle-ready:
	@waited=0; until [ -e $(TIER_LOGS)/bundle.passed ]; do \
	  if [ -e $(TIER_LOGS)/bundle.failed ]; then echo "the bundle tier failed: nothing to install" >&2; exit 1; fi; \
	  if [ $$waited -ge $(BUNDLE_WAIT_S) ]; then echo "no bundle after $(BUNDLE_WAIT_S) s: the bundle tier did not end" >&2; exit 1; fi; \
	  [ $$((waited % 60)) -ne 0 ] || echo "waiting for the bundle tier ($$waited s)"; \
	  sleep 5; waited=$$((waited + 5)); \
	done
bundle-test: $(BUNDLE_DEP)
	WARREN_BUNDLE=$(BUNDLE) $(BIN)/pytest -m bundle tests/bundle

# site.yml with the sample inventory from that bundle onto three hosts made of network and
# mount namespaces with sshd (as root), with no route out and no apt source but the bundle.
.PHONY: hosts-test
hosts-test: $(BUNDLE_DEP)
	WARREN_BUNDLE=$(BUNDLE) $(BIN)/pytest -m hosts -rP tests/hosts

# Warren's service images (warren-control, warren-blockd, seaweedfs, postgres) from Debian's
# packages and this checkout's wheels (as root): each runs inside its image, a rebuild from
# nothing cached gives the same digests, and a real registry on loopback serves them.
.PHONY: images-test
images-test: venv
	$(BIN)/pytest -m images -rP tests/images

## Benchmarks write JSON to bench/results/ (ratios against a baseline from the same run).
bench-runtime: venv
	bench/run-runtime.sh

# Boot, snapshot and branch 1/8/32 children with real QEMU (TCG unless WARREN_FORKD_ACCEL=kvm);
# writes bench/results/forkd.json with the issue's two acceptance ratios from the same run.
.PHONY: bench-forkd
bench-forkd: $(FORKD)/.venv/.installed
	bench/run-forkd.sh

# As root (FUSE, loop devices, mounts); the project-build images come from the Go module
# cache the cluster binaries fill, so those are built (or found) first.
bench-blockd: $(BLOCKD)/.venv/.installed
	tools/build-cluster-binaries.sh >/dev/null
	$(BLOCKD)/.venv/bin/python bench/blockd.py

# warren-blockd's own FUSE loop against the libfuse path (mfusepy) it replaced, the same
# device behind a loop device with direct I/O, arms alternating (as root).
bench-blockd-fuse: $(BLOCKD)/.venv/.installed
	$(BLOCKD)/.venv/bin/python bench/blockd_fuse.py

# Create through the whole platform against the same pod made directly, GETs through the edge,
# and the controller's reconcile rate on kwok nodes (as root: the local cluster's node).
bench-control: venv $(CONTROL)/.venv/.installed
	bench/run-control.sh control

# Create to a command's output through the API from a warm pool and cold, against the same
# pod made directly; 100 idle sandboxes on the node; the edge against a bare handler; the
# reconcile rate against direct pods (kwok); then on the platform site.yml deploys (every
# sandbox with its workspace): the base pool's creates, cold ones, and forks into eight
# children. Writes bench/results/start.json.
.PHONY: bench-start
bench-start: venv $(CONTROL)/.venv/.installed
	bench/run-control.sh start

# A sandbox's pod made directly until Ready, with the kubelet's generic PLEG and with evented
# PLEG (node.evented_pleg), on a throw-away cluster each; writes bench/results/coldpath.json.
.PHONY: bench-coldpath
bench-coldpath: venv $(CONTROL)/.venv/.installed
	bench/run-coldpath.sh

# Exec round trip through the sandbox's agent against Kubernetes exec, one sandbox of the
# deployed platform (make deploy first); writes bench/results/exec.json.
.PHONY: bench-exec
bench-exec: venv
	bench/run-deployed.sh exec

# Pause with memory and resume against a cold start of the same image, on the deployed
# platform (make deploy first); writes bench/results/pause.json.
.PHONY: bench-pause
bench-pause: venv
	bench/run-deployed.sh pause

# Fork to Running for a 1 GiB and an 8 GiB workspace, create with an empty one (as root).
bench-workspace: venv $(BLOCKD)/.venv/.installed
	bench/run-workspace.sh

clean:
	rm -rf $(VENV) test-results rendered
