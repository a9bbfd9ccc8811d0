"""Pods made by controllers meet the same floor: a Deployment's or Job's bad pods are
refused, and the refusal shows up in the owner's events."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client
from warren_common.testing import wait_for

from warren.conformance.kube import Obj, sandbox_pod, unique


def _template(bad: bool) -> Obj:
    pod = sandbox_pod("unused")
    if bad:
        del pod["spec"]["runtimeClassName"]
    return {"metadata": {"labels": {"app": pod["metadata"]["labels"]["app"]}}, "spec": pod["spec"]}


def _deployment(name: str, bad: bool) -> Obj:
    template = _template(bad)
    template["metadata"]["labels"]["workload"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"workload": name}}, "template": template},
    }


def _job(name: str, bad: bool) -> Obj:
    template = _template(bad)
    template["spec"]["restartPolicy"] = "Never"
    template["metadata"]["labels"]["workload"] = name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": template},
    }


def _failed_create_messages(core: client.CoreV1Api, ns: str) -> list[str]:
    events = core.list_namespaced_event(ns).items
    return [e.message or "" for e in events if e.reason == "FailedCreate"]


def _pods(core: client.CoreV1Api, ns: str, workload: str) -> list[Any]:  # V1Pods (untyped)
    return list(core.list_namespaced_pod(ns, label_selector=f"workload={workload}").items)


def test_deployment_bad_pods_refused_with_event(
    api: client.ApiClient, core: client.CoreV1Api, sandbox_ns: str
) -> None:
    name = unique("bad-deploy")
    client.AppsV1Api(api).create_namespaced_deployment(sandbox_ns, _deployment(name, bad=True))
    messages = wait_for(
        lambda: [
            m
            for m in _failed_create_messages(core, sandbox_ns)
            if name in m and "[warren:runtime-class]" in m
        ],
        timeout=90,
        what=f"a FailedCreate event naming the rule for {name}",
        interval=1.0,
    )
    assert messages
    assert _pods(core, sandbox_ns, name) == []


def test_job_bad_pods_refused_with_event(
    api: client.ApiClient, core: client.CoreV1Api, sandbox_ns: str
) -> None:
    name = unique("bad-job")
    client.BatchV1Api(api).create_namespaced_job(sandbox_ns, _job(name, bad=True))
    wait_for(
        lambda: [
            m
            for m in _failed_create_messages(core, sandbox_ns)
            if "[warren:runtime-class]" in m and name in m
        ],
        timeout=90,
        what=f"a FailedCreate event naming the rule for {name}",
        interval=1.0,
    )
    assert _pods(core, sandbox_ns, name) == []


def test_deployment_good_pods_admitted(
    api: client.ApiClient, core: client.CoreV1Api, sandbox_ns: str
) -> None:
    name = unique("ok-deploy")
    client.AppsV1Api(api).create_namespaced_deployment(
        sandbox_ns, copy.deepcopy(_deployment(name, bad=False))
    )
    pods = wait_for(lambda: _pods(core, sandbox_ns, name), timeout=90, what=f"a pod of {name}", interval=1.0)
    assert all(p.spec.runtime_class_name == "gvisor" for p in pods)
