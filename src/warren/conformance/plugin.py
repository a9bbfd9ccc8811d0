"""pytest plugin for the conformance suite: options and the closing markdown summary."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("warren")
    group.addoption("--kubeconfig", type=Path, help="kubeconfig of the cluster under test")
    group.addoption(
        "--warren-config",
        type=Path,
        default=None,
        help="the Warren configuration the cluster was installed with",
    )
    group.addoption(
        "--image",
        default="busybox:stable",
        help="a busybox image the cluster's nodes can start (runtime and egress tests)",
    )
    group.addoption(
        "--runtime-tests",
        action="store_true",
        help="also start real pods and look inside them (needs nodes with gVisor)",
    )
    group.addoption(
        "--pod-security-fixtures",
        type=Path,
        default=None,
        help="the test/testdata directory of the Go module k8s.io/pod-security-admission at the "
        "cluster's version (default: found in, or downloaded to, the Go module cache)",
    )
    group.addoption(
        "--api-url",
        default=None,
        help="the platform tier: the installed platform's API endpoint (its edge), e.g. http://127.0.0.1:8080",
    )
    group.addoption(
        "--api-key-file",
        type=Path,
        default=None,
        help="the platform tier: a file holding an API key of that platform",
    )
    group.addoption(
        "--gateway-test-ca",
        type=Path,
        default=None,
        help="the egress gateway's tests: a directory with ca.crt and ca.key, the CA the platform's "
        "gateway trusts (services.gateway_trusted_ca); they need --egress-test-hosts local and the "
        "platform tier's options too",
    )
    group.addoption(
        "--egress-test-hosts",
        choices=["none", "local"],
        default="none",
        help="local: make test hosts in network namespaces on this machine (root; every node must "
        "run on it) and prove the egress floor against them from a pod on each node",
    )


class _Summary:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.failures: list[str] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and not (report.failed or report.skipped):
            return
        area = report.nodeid.split("::")[0].rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py")
        outcome = report.outcome
        self.counts[area][outcome] += 1
        if report.failed:
            self.failures.append(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write = terminalreporter.write_line
        write("")
        write("## Warren conformance")
        write("")
        write("| area | passed | failed | skipped |")
        write("|---|---:|---:|---:|")
        for area in sorted(self.counts):
            c = self.counts[area]
            write(f"| {area} | {c['passed']} | {c['failed']} | {c['skipped']} |")
        total = {k: sum(c[k] for c in self.counts.values()) for k in ("passed", "failed", "skipped")}
        write(f"| **total** | {total['passed']} | {total['failed']} | {total['skipped']} |")
        if self.failures:
            write("")
            write("Failed:")
            for nodeid in self.failures:
                write(f"- `{nodeid}`")
        write("")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Summary(), "warren-summary")
