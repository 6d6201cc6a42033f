"""What a schema cannot see in deploy/k8s: the objects agree with each other and with sr.

A Service that selects no pod, a ServiceMonitor sending a key the router does not accept,
`$(VAR)` left unresolved (Kubernetes then passes the literal text), a grace period shorter
than sr's drain, a startupProbe that kills a pod sr would still have let load, a GPU count
that differs from the config's devices, a router discovering a name no Service has: each
renders and validates fine, and each is checked here against the rendered overlays and
against sr's own constants and config loader.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sr.config.load import load_config, parse_config
from sr.pool.replica import STOP_GRACE_S
from sr.pool.supervisor import DRAIN_TIMEOUT_S
from sr.router.serve import HTTP_GRACE_S
from sr.settings import READY_TIMEOUT_ENV, parse_duration
from sr.worker.cli import parse_command
from sr.worker.http import WORKER_HTTP_LIMITS
from tests.deploy.manifests import (
    configmap_file,
    containers,
    env_entry,
    env_value,
    labels_match,
    main_container,
    one,
    overlays,
    pod_spec,
    prestop_sleep_s,
    probe_budget_s,
    rendered,
    workloads,
)
from tests.deploy.render_config_module import render_config

GPU_PLATFORMS = {"nvidia.com/gpu": "cuda", "amd.com/gpu": "rocm"}
# CoreDNS's kubernetes plugin answers with a 5 s TTL unless configured otherwise.
DNS_TTL_S = 5
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _runs(container: dict, command: str) -> bool:
    return container.get("args", [None])[0] == command


def _serving(docs):
    """(workload, container) for every `sr serve` container."""
    return [(w, c) for w in workloads(docs) for c in containers(w) if _runs(c, "serve")]


def _worker(docs):
    (found,) = [(w, c) for w in workloads(docs) for c in containers(w) if _runs(c, "worker")]
    return found


def _sr_config(docs, workload, tmp_path: Path, keys: str = "client-key,metrics-key"):
    """The config the pod serves: its ConfigMap after render_config adds the keys."""
    _, text = configmap_file(docs, "config", workload)
    source, target = tmp_path / "source.yaml", tmp_path / "config.yaml"
    source.write_text(text)
    render_config.render(str(source), str(target), {"SR_API_KEYS": keys})
    return load_config(target)


def _arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def _gpu_limits(container: dict) -> dict[str, int]:
    limits = container.get("resources", {}).get("limits", {})
    return {name: int(limits[name]) for name in GPU_PLATFORMS if name in limits}


@pytest.mark.parametrize("overlay", overlays())
def test_services_and_budgets_select_pods_and_name_their_ports(overlay):
    docs = rendered(overlay)
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        (workload,) = [
            w
            for w in workloads(docs)
            if labels_match(selector, w["spec"]["template"]["metadata"]["labels"])
        ]
        port_names = {p["name"] for p in main_container(workload)["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, (service["metadata"]["name"], port)
    for budget in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        assert [
            w
            for w in workloads(docs)
            if labels_match(selector, w["spec"]["template"]["metadata"]["labels"])
        ], budget["metadata"]["name"]


@pytest.mark.parametrize("overlay", [o for o in overlays() if not o.endswith("/cpu")])
def test_the_service_monitor_scrapes_metrics_with_a_key_the_router_accepts(overlay):
    docs = rendered(overlay)
    monitor = one(docs, "ServiceMonitor")
    (service,) = [
        d
        for d in docs
        if d["kind"] == "Service"
        and labels_match(monitor["spec"]["selector"]["matchLabels"], d["metadata"]["labels"])
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    # The router's keys are SR_API_KEYS of its init container: each $(VAR) in it is a
    # Secret key; the one Prometheus sends must be among them.
    ((workload, _),) = _serving(docs)
    (init,) = pod_spec(workload)["initContainers"]
    accepted = [
        env_entry(init, name)["valueFrom"]["secretKeyRef"]
        for name in VAR_REF.findall(env_value(init, "SR_API_KEYS"))
    ]
    assert {"name": credentials["name"], "key": credentials["key"]} in accepted


@pytest.mark.parametrize("overlay", overlays())
def test_every_variable_reference_resolves(overlay):
    # Kubernetes leaves an undefined $(VAR) as literal text: SR_API_KEYS would then hold
    # the key "$(SR_METRICS_API_KEY)".
    for workload in workloads(rendered(overlay)):
        for container in containers(workload):
            env = container.get("env", [])
            names = {e["name"] for e in env}
            for i, entry in enumerate(env):
                for ref in VAR_REF.findall(entry.get("value", "")):
                    assert ref in {e["name"] for e in env[:i]}, (container["name"], ref)
            for arg in container.get("args", []) + container.get("command", []):
                for ref in VAR_REF.findall(arg):
                    assert ref in names, (container["name"], ref)


@pytest.mark.parametrize("overlay", overlays())
def test_images_are_tagged_and_pods_run_as_non_root(overlay):
    for workload in workloads(rendered(overlay)):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        images = set()
        for container in containers(workload):
            name, _, tag = container["image"].rpartition(":")
            assert name and tag and tag != "latest", container["image"]
            images.add(container["image"])
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert len(images) == 1, f"one image per pod, got {images}"


@pytest.mark.parametrize("overlay", overlays())
def test_probes_follow_srs_endpoints_and_the_startup_probe_outlasts_the_ready_timeout(overlay):
    docs = rendered(overlay)
    for _, container in _serving(docs):
        ready_timeout_s = parse_duration(env_value(container, READY_TIMEOUT_ENV))
        startup = container["startupProbe"]
        assert startup["httpGet"]["path"] == "/ready"
        # sr gives up first and says why; the kubelet's kill comes after.
        assert probe_budget_s(startup) > ready_timeout_s
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    if overlay.startswith("fleet/"):
        _, worker = _worker(docs)
        assert worker["readinessProbe"]["httpGet"]["path"] == "/health"
        assert worker["livenessProbe"]["httpGet"]["path"] == "/health/live"


@pytest.mark.parametrize("overlay", overlays())
def test_the_grace_period_covers_prestop_and_srs_drain(overlay):
    docs = rendered(overlay)
    for workload, container in _serving(docs):
        # preStop, then on SIGTERM: in-flight requests, replica drain, worker stop.
        needed = prestop_sleep_s(container) + HTTP_GRACE_S + DRAIN_TIMEOUT_S + STOP_GRACE_S
        assert pod_spec(workload)["terminationGracePeriodSeconds"] > needed
    if overlay.startswith("fleet/"):
        workload, worker = _worker(docs)
        needed = prestop_sleep_s(worker) + WORKER_HTTP_LIMITS.graceful_timeout_s
        assert pod_spec(workload)["terminationGracePeriodSeconds"] > needed


@pytest.mark.parametrize("overlay", [o for o in overlays() if o.startswith("single-pod/")])
def test_single_pod_gpus_match_the_configs_allocation_ordinals(overlay, tmp_path):
    docs = rendered(overlay)
    ((workload, container),) = _serving(docs)
    devices = [
        r.device for r in _sr_config(docs, workload, tmp_path).deployments["primary"].replicas
    ]
    gpus = _gpu_limits(container)
    if overlay.endswith("/cpu"):
        assert gpus == {} and set(devices) == {"cpu"}
        return
    ((resource, count),) = gpus.items()
    platform = GPU_PLATFORMS[resource]
    # One worker per GPU of the pod, numbered as the pod sees them: 0..N-1.
    assert devices == [f"{platform}:{i}" for i in range(count)]
    tolerated = {t["key"] for t in pod_spec(workload).get("tolerations", [])}
    assert resource in tolerated


@pytest.mark.parametrize("overlay", [o for o in overlays() if o.startswith("fleet/")])
def test_fleet_workers_have_one_device_each(overlay):
    workload, worker = _worker(rendered(overlay))
    assert workload["kind"] == "StatefulSet"
    device = env_value(worker, "WORKER_DEVICE")
    assert _arg(worker, "--device") == "$(WORKER_DEVICE)"
    gpus = _gpu_limits(worker)
    if overlay.endswith("/cpu"):
        assert gpus == {} and device == "cpu"
    else:
        ((resource, count),) = gpus.items()
        assert count == 1 and device == f"{GPU_PLATFORMS[resource]}:0"
        assert resource in {t["key"] for t in pod_spec(workload).get("tolerations", [])}


@pytest.mark.parametrize("overlay", overlays())
def test_the_config_loads_in_sr_with_the_secrets_keys_and_listens_on_the_pod_port(
    overlay, tmp_path
):
    docs = rendered(overlay)
    for workload, container in _serving(docs):
        config = _sr_config(docs, workload, tmp_path)
        (listener,) = config.listeners
        assert listener.api_keys == ["client-key", "metrics-key"]
        assert listener.host == "0.0.0.0"
        (http,) = [p for p in container["ports"] if p["name"] == "http"]
        assert listener.port == http["containerPort"]
        # The ConfigMap itself carries no key.
        _, text = configmap_file(docs, "config", workload)
        assert parse_config(text).listeners[0].api_keys == []


@pytest.mark.parametrize("overlay", [o for o in overlays() if o.startswith("fleet/")])
def test_the_router_discovers_the_workers_headless_service(overlay, tmp_path):
    docs = rendered(overlay)
    ((router, router_container),) = _serving(docs)
    workers, worker = _worker(docs)
    (entry,) = _sr_config(docs, router, tmp_path).deployments["primary"].replicas
    target = urlsplit(entry.discover)
    assert target.scheme == "dns"
    service = one(docs, "Service", target.hostname)
    assert service["metadata"]["name"] == target.hostname
    # Headless: DNS answers with the ready pods' own addresses, one replica each.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"].get("publishNotReadyAddresses", False) is False
    assert workers["spec"]["serviceName"] == target.hostname
    assert labels_match(
        service["spec"]["selector"], workers["spec"]["template"]["metadata"]["labels"]
    )
    (port,) = service["spec"]["ports"]
    assert target.port == port["port"] == int(_arg(worker, "--port"))
    (worker_port,) = worker["ports"]
    assert worker_port["containerPort"] == target.port
    # The router asks for the model the workers serve, with the key they hold.
    assert entry.model == env_value(worker, "WORKER_ARTIFACT")
    sent = env_entry(router_container, entry.api_key_env)["valueFrom"]["secretKeyRef"]
    held = env_entry(worker, "SR_WORKER_API_KEY")["valueFrom"]["secretKeyRef"]
    assert sent == held
    # A terminating worker leaves DNS at once; it keeps serving until every router has
    # re-resolved (one refresh plus the TTL) and drained it.
    assert prestop_sleep_s(worker) >= entry.effective_refresh_s + DNS_TTL_S


@pytest.mark.parametrize("overlay", [o for o in overlays() if o.startswith("fleet/")])
def test_sr_worker_accepts_the_pods_command_line_and_serves_what_the_router_expects(
    overlay, tmp_path, monkeypatch
):
    docs = rendered(overlay)
    ((router, _),) = _serving(docs)
    _, worker = _worker(docs)
    # The pod's environment as the kubelet builds it (a Secret's value and the pod's name
    # stand in), and its args with $(VAR) expanded: parsed by `sr worker`'s own parser,
    # its key rule included.
    stand_ins = {"secretKeyRef": "from-the-secret", "fieldRef": "sr-workers-0"}
    env = {
        e["name"]: e["value"] if "value" in e else stand_ins[next(iter(e["valueFrom"]))]
        for e in worker["env"]
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = [VAR_REF.sub(lambda m: env[m[1]], arg) for arg in worker["args"]]
    assert args[0] == "worker"
    options = parse_command(args[1:]).options
    deployment = _sr_config(docs, router, tmp_path).deployments["primary"]
    # The router marks a worker whose card differs `incompatible`; input limits it does not
    # check, so they must agree here.
    assert options.artifact == deployment.artifact
    assert options.profile == deployment.profile
    assert (options.max_tokens, options.overflow) == (
        deployment.input.max_tokens,
        deployment.input.overflow,
    )
    # Never more compute threads than the CPUs the pod may use.
    assert options.threads <= int(worker["resources"]["limits"]["cpu"])
