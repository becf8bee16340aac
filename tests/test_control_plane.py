"""The control-plane tier's own plumbing (tools/control_plane/), without building or starting it: the
versions it runs come from the stacks' config; its wrapper modules repeat upstream's replaces as Go
would need them; a webhook configuration calls the process with the tier's CA and fails closed; the
tier refuses to start outside its own namespace; and under CI=true what it cannot have is a failure."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from common.cluster_target import K3S_IMAGE, KUBERNETES_MINOR
from tools.control_plane import __main__ as launcher
from tools.control_plane import build, components, upstream
from tools.control_plane.cluster import Binaries, Kubernetes, NotIsolated


def test_the_tier_runs_the_versions_the_stacks_install():
    pins = components.pins()
    # Pulumi.local.yaml's k3s image: the tier runs the Kubernetes both stacks name.
    assert pins.kubernetes == K3S_IMAGE.removeprefix("rancher/k3s:").removesuffix("-k3s1")
    assert pins.kubernetes.startswith(f"v{KUBERNETES_MINOR}.")
    local = components.stack_pins("local")
    assert (pins.trainer, pins.kueue, pins.kserve, pins.argo, pins.keda) == (
        local.trainer,
        local.kueue,
        local.kserve,
        local.argo,
        local.keda,
    )
    assert components.stack_pins("gke").kubernetes is None  # GKE's release channel picks it


def test_stacks_that_install_different_versions_are_refused_naming_both(monkeypatch):
    real = components.stack_pins
    monkeypatch.setattr(
        components,
        "stack_pins",
        lambda stack: (
            real(stack)
            if stack == "local"
            else components.StackPins(None, "v2.2.0", "v0.19.2", "v0.20.0", "v4.1.2", "v2.18.0")
        ),
    )
    with pytest.raises(
        components.PinError, match="Pulumi.gke.yaml installs trainer v2.2.0 and Pulumi.local.yaml v2.3.0"
    ):
        components.pins()


def test_jobsets_version_is_the_one_trainers_overlay_installs(tmp_path):
    overlay = tmp_path / "manifests" / "third-party" / "jobset"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(
        "resources:\n  - https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml\n"
    )
    assert components.jobset_version(tmp_path) == "v0.12.0"
    (overlay / "kustomization.yaml").write_text("resources: []\n")
    with pytest.raises(components.PinError, match="expected one JobSet release, found none"):
        components.jobset_version(tmp_path)


def test_the_wrapper_repeats_upstreams_replaces_and_releases_kubernetes_staging_modules():
    """Kubernetes' go.mod requires its staging modules at v0.0.0 and replaces them with local paths:
    ours names their release (v0.33.4 for v1.33.4). A versioned replace (KServe's, KEDA's) is kept as
    it is; a local replace of a module required at a real version (etcd's own) changes nothing."""
    upstream_mod = {
        "Go": "1.24.0",
        "Require": [
            {"Path": "k8s.io/api", "Version": "v0.0.0"},
            {"Path": "go.etcd.io/etcd/api/v3", "Version": "v3.5.21"},
        ],
        "Replace": [
            {"Old": {"Path": "k8s.io/api"}, "New": {"Path": "./staging/src/k8s.io/api"}},
            {"Old": {"Path": "go.etcd.io/etcd/api/v3"}, "New": {"Path": "../api"}},
            {
                "Old": {"Path": "sigs.k8s.io/controller-runtime"},
                "New": {"Path": "sigs.k8s.io/controller-runtime", "Version": "v0.22.5"},
            },
        ],
    }
    assert build.mirrored_replaces(upstream_mod, "v1.33.4") == [
        "k8s.io/api => k8s.io/api v0.33.4",
        "sigs.k8s.io/controller-runtime => sigs.k8s.io/controller-runtime v0.22.5",
    ]
    wrapper = build.wrapper_go_mod(components.kubernetes("v1.33.4"), upstream_mod)
    assert (
        "require k8s.io/kubernetes v1.33.4" in wrapper and "\tk8s.io/kubernetes/cmd/kube-apiserver" in wrapper
    )


def test_argoexec_is_built_static_from_a_copy_of_argos_module_with_its_links_restored(tmp_path, monkeypatch):
    """Go's module zips drop symbolic links, and Argo's Linux signal handling is one
    (signal_linux.go -> signal_darwin.go): the copy restores it, and the wrapper builds from the copy."""
    module = tmp_path / "argo@v4.0.5"
    (module / "workflow" / "executor" / "osspecific").mkdir(parents=True)
    (module / "workflow" / "executor" / "osspecific" / "signal_darwin.go").write_text("package osspecific\n")
    (module / "workflow" / "executor" / "osspecific").chmod(0o555)  # as the module cache has it
    monkeypatch.setattr(build, "stamped_binaries_dir", lambda component: tmp_path / "stamped" / "x")
    component = components.argoexec("v4.0.5")
    assert component.static and component.module == components.argo("v4.0.5").module
    source = build.source_copy(component, module)
    linked = source / "workflow" / "executor" / "osspecific" / "signal_linux.go"
    assert linked.read_text() == "package osspecific\n"
    wrapper = build.wrapper_go_mod(component, {"Go": "1.24.0"}, source)
    assert f"github.com/argoproj/argo-workflows/v4 v4.0.5 => {source}" in wrapper


def test_kube_router_is_built_from_k3s_fork_with_k3s_replaces():
    """k3s' go.mod replaces kube-router's module with its fork (and genproto with the release its
    requirements need): ours does too, so the program is the module k3s embeds."""
    component = components.kube_router()
    assert component.served_module == components.KUBE_ROUTER_FORK
    wrapper = build.wrapper_go_mod(component, {"Go": "1.23.11"})
    assert f"require {components.KUBE_ROUTER_MODULE} {components.KUBE_ROUTER_VERSION}" in wrapper
    assert (f"\t{components.KUBE_ROUTER_MODULE} => {components.KUBE_ROUTER_FORK} "
            f"{components.KUBE_ROUTER_VERSION}\n") in wrapper
    assert f"\t{components.K3S_GENPROTO}\n" in wrapper
    assert f"\t{components.KUBE_ROUTER_MODULE}/cmd/kube-router" in wrapper


def test_a_module_outside_the_checksum_database_must_hash_as_its_consumer_recorded(monkeypatch):
    """sum.golang.org has no entry for k3s' fork: Go is told not to ask it, and the zip the proxy serves
    must hash to what k3s' go.sum records, or nothing is built from it."""
    module = f"{components.KUBE_ROUTER_FORK}@{components.KUBE_ROUTER_VERSION}"
    assert components.KUBE_ROUTER_FORK in build.go_env()["GONOSUMDB"].split(",")
    served = {"Path": components.KUBE_ROUTER_FORK, "Dir": "/m", "Sum": components.RECORDED_SUMS[module]}
    monkeypatch.setattr(build, "go", lambda *args, **kwargs: json.dumps(served))
    assert build.download(components.KUBE_ROUTER_FORK, components.KUBE_ROUTER_VERSION)["Dir"] == "/m"
    served["Sum"] = "h1:tampered="
    with pytest.raises(build.BuildError, match="hashes to h1:tampered=, and its consumer's go.sum records"):
        build.download(components.KUBE_ROUTER_FORK, components.KUBE_ROUTER_VERSION)


def test_kube_router_runs_with_the_rights_its_own_install_grants(tmp_path):
    install = tmp_path / upstream.KUBE_ROUTER_INSTALL
    install.parent.mkdir()
    install.write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: ServiceAccount
        metadata: {name: kube-router, namespace: kube-system}
        ---
        kind: ClusterRole
        apiVersion: rbac.authorization.k8s.io/v1
        metadata: {name: kube-router, namespace: kube-system}
        rules:
          - apiGroups: ["networking.k8s.io"]
            resources: [networkpolicies]
            verbs: [list, get, watch]
        """))
    role, binding = upstream.kube_router_access(tmp_path, "system:kube-router")
    assert role["metadata"] == {"name": "kube-router"}
    assert role["rules"][0]["resources"] == ["networkpolicies"]
    assert binding["roleRef"]["name"] == "kube-router"
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "system:kube-router"}]


def test_kubernetes_programs_carry_their_release_as_its_build_stamps_it():
    flags = components.kubernetes("v1.33.4").stamps()
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        for setting in ("gitMajor=1", "gitMinor=33", "gitVersion=v1.33.4"):
            assert f"-X {package}.{setting}" in flags


def test_a_program_named_after_a_major_version_is_named_after_its_component():
    assert build.program_name("etcd", "go.etcd.io/etcd/server/v3") == "etcd"
    assert build.program_name("kueue", "sigs.k8s.io/kueue/cmd/kueue") == "kueue"


def test_a_webhook_calls_the_process_with_the_tiers_ca_and_fails_closed():
    configuration = {
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "keda-admission", "annotations": {"cert-manager.io/inject-ca-from": "x"}},
        "webhooks": [
            {
                "name": "vscaledobject.keda.sh",
                "failurePolicy": "Ignore",
                "clientConfig": {
                    "service": {"name": "keda-admission-webhooks", "namespace": "keda", "path": "/validate"}
                },
            }
        ],
    }
    (routed,) = upstream.served_by([configuration], 9445, b"CA")
    (webhook,) = routed["webhooks"]
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:9445/validate",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert webhook["failurePolicy"] == "Fail"
    assert "annotations" not in routed["metadata"]
    assert configuration["webhooks"][0]["failurePolicy"] == "Ignore"  # upstream's, untouched


def test_a_managers_config_is_upstreams_with_what_a_pod_would_give_the_process_instead(tmp_path):
    """Its ports on 127.0.0.1, metrics off, its own certificate rotation off, its lease in the namespace
    named; upstream's other settings kept, and those given over them."""
    ctx = upstream.Context({}, str, None, tmp_path, tmp_path / "admin.kubeconfig", {})
    theirs = {"webhook": {"port": 9443}, "leaderElection": {"leaderElect": True},
              "controller": {"groupKindConcurrency": {"Job.batch": 5}}}
    path = upstream.manager_config(ctx, "kueue", theirs, "kueue-system", "internalCertManagement",
                                   tmp_path / "certs", namespace="kueue-system")
    ports = upstream.PORTS["kueue"]
    assert yaml.safe_load(path.read_text()) == {
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(tmp_path / "certs")},
        "leaderElection": {"leaderElect": True, "resourceNamespace": "kueue-system"},
        "controller": {"groupKindConcurrency": {"Job.batch": 5}},
        "internalCertManagement": {"enable": False},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "namespace": "kueue-system",
    }
    # Without a certificate directory, the webhook server reads controller-runtime's default one.
    path = upstream.manager_config(ctx, "trainer", {}, "kubeflow-system", "certManagement")
    assert "certDir" not in yaml.safe_load(path.read_text())["webhook"]


def test_no_two_programs_of_the_tier_are_given_one_port():
    """One network namespace holds them all: a program given a port another holds fails to bind it, and
    a readiness check on that port asks the other one."""
    from tools.control_plane import cluster, tier
    from tools.control_plane.nodes import real

    ports = [
        cluster.ETCD_CLIENT_PORT, cluster.ETCD_PEER_PORT, cluster.API_SERVER_PORT,
        cluster.CONTROLLER_MANAGER_PORT, cluster.SCHEDULER_PORT, tier.KWOK_HEALTH_PORT,
        real.KUBELET_PORT, real.KUBELET_HEALTH_PORT, real.KUBE_PROXY_HEALTH_PORT,
        real.KUBE_PROXY_METRICS_PORT,
        real.COREDNS_READY_PORT, real.COREDNS_HEALTH_PORT, real.KUBE_ROUTER_HEALTH_PORT,
        upstream.ARGO_HEALTH_PORT, upstream.KEDA_GRPC_PORT,
        *(port for pair in upstream.PORTS.values() for port in (pair.webhook, pair.health) if port),
    ]
    assert len(ports) == len(set(ports)), sorted(ports)


def test_the_aggregation_layer_reaches_kedas_adapter_process_through_its_service_without_a_selector():
    """KEDA's APIService and Service as config/metrics-server (v2.18.0) has them: the aggregation layer
    checks the adapter's certificate with the tier's CA and routes to the Service's endpoint, the
    process on the tier's bridge (no pod for the selector to find)."""
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "keda-metrics-apiserver", "namespace": "keda"},
               "spec": {"selector": {"app": "keda-metrics-apiserver"}, "ports": [
                   {"name": "https", "port": 443, "targetPort": 6443},
                   {"name": "metrics", "port": 8080, "targetPort": 8080}]}}
    api_service = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                   "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                   "spec": {"service": {"name": "keda-metrics-apiserver", "namespace": "keda"}}}
    routed = upstream.metrics_adapter_objects([api_service, service], "10.244.0.1", 9446, b"the tier's CA")
    by_kind = {obj["kind"]: obj for obj in routed}
    assert base64.b64decode(by_kind["APIService"]["spec"]["caBundle"]) == b"the tier's CA"
    assert "selector" not in by_kind["Service"]["spec"]
    assert by_kind["Service"]["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": 9446}]
    assert by_kind["Endpoints"]["metadata"] == service["metadata"]
    assert by_kind["Endpoints"]["subsets"] == [
        {"addresses": [{"ip": "10.244.0.1"}], "ports": [{"name": "https", "port": 9446}]}]
    assert "selector" in service["spec"]  # upstream's objects left as they were


@pytest.mark.parametrize("name, ci, substituted", [
    ("kueue", "true", False),  # not declared: CI fails, naming it
    ("kueue", "", True),  # a developer's tier runs, its log saying so
    ("argo", "true", True),  # declared in components.SUBSTITUTES, with why
])
def test_a_component_the_proxy_does_not_serve_at_its_pin_is_substituted_only_where_declared(
    monkeypatch, name, ci, substituted
):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(build, "served_version", lambda module, pinned: "v1.0.0")
    component = components.Component(name, f"example.com/{name}", "v1.1.0", (), "platform.someVersion")
    if substituted:
        assert build.version_to_build(component, "v1.1.0") == "v1.0.0"
    else:
        expected = rf"^{name}: the module proxy serves no example.com/{name}@v1.1.0 \(platform.someVersion's"
        with pytest.raises(build.BuildError, match=expected):
            build.version_to_build(component, "v1.1.0")
    assert set(components.SUBSTITUTES) == {"argo", "pulumi", "pulumi-kubernetes"}


def test_a_declared_substitute_version_is_built_only_where_the_pin_is_not_served(monkeypatch):
    """The engine and the provider have substitutes that are not the newest release before their pins
    (the engine's is after the SDK's, the provider's a commit): the pin itself when the proxy serves it."""
    component = components.pulumi("v3.272.0")
    monkeypatch.setattr(build, "is_served", lambda module, version: False)
    assert build.version_to_build(component, "v3.272.0") == components.SUBSTITUTE_VERSIONS["pulumi"]
    monkeypatch.setattr(build, "is_served", lambda module, version: True)
    assert build.version_to_build(component, "v3.272.0") == "v3.272.0"


def test_the_provider_is_stamped_with_the_release_its_commit_is_tagged_as():
    provider = components.pulumi_kubernetes(components.SUBSTITUTE_VERSIONS["pulumi-kubernetes"], "v4.24.0")
    assert provider.stamps().endswith("/pkg/version.Version=4.25.0")
    assert dict(provider.generate_env) == {"VERSION": "4.25.0"}
    assert provider.siblings == (("../sdk", components.PULUMI_KUBERNETES_SDK_MODULE, "v4.24.0"),)
    assert components.pulumi_kubernetes("v4.34.2", "v4.34.2").stamps().endswith("Version=4.34.2")


def test_a_copy_has_the_files_upstreams_build_makes_and_its_repositorys_modules_beside_it(
        tmp_path, monkeypatch):
    module, sdk = tmp_path / "provider@v1", tmp_path / "sdk@v1"
    (module / "cmd").mkdir(parents=True)
    (sdk / "go").mkdir(parents=True)
    monkeypatch.setattr(build, "stamped_binaries_dir", lambda component: tmp_path / "stamped" / "x")
    monkeypatch.setattr(build, "download", lambda name, version: {"Dir": str(sdk)})
    generated = []
    monkeypatch.setattr(build, "go", lambda *args, cwd, env=None, **kw: generated.append((args, cwd, env)))
    component = components.Component(
        "thing", "example.com/thing", "v1.0.0", (), "x", files=(("ui/index.html", "<p>"),),
        siblings=(("../sdk", "example.com/sdk", "v1.0.0"),), generate=("cmd",),
        generate_env=(("VERSION", "1"),))
    source = build.source_copy(component, module)
    assert (source / "ui" / "index.html").read_text() == "<p>"
    assert (source.parent / "sdk" / "go").is_dir()
    assert generated == [(("generate", "./cmd"), source, {"VERSION": "1"})]
    assert build.source_copy(component, module) == source and len(generated) == 1  # made once


def test_the_tier_will_not_bind_its_fixed_ports_outside_its_own_namespace(tmp_path, monkeypatch):
    monkeypatch.delenv("DIST_ML_CONTROL_PLANE_NAMESPACE", raising=False)
    with pytest.raises(NotIsolated, match="python -m tools.control_plane test"):
        Kubernetes(tmp_path, Binaries({}, {}), pki=None).start()


@pytest.mark.parametrize("ci, status", [("true", 1), ("", 0)])
def test_what_the_tier_cannot_have_fails_under_ci_and_is_said_elsewhere(monkeypatch, capsys, ci, status):
    monkeypatch.setenv("CI", ci)
    assert launcher.unavailable(build.Unavailable("go is not on PATH")) == status
    assert "go is not on PATH" in capsys.readouterr().err


def test_make_tests_two_tiers_run_at_once_and_both_outputs_are_printed_with_their_status(
    tmp_path, monkeypatch, capsys
):
    """Each tier's run (here a stand-in) waits until the other has started: run one after the other,
    the first would give up."""

    def stand_in(*command: str, output=None) -> subprocess.Popen:
        name = "test" if "tests/cluster" in command else "e2e"
        other = "e2e" if name == "test" else "test"
        script = textwrap.dedent(f"""
            import time
            from pathlib import Path
            Path({str(tmp_path / name)!r}).touch()
            deadline = time.monotonic() + 20
            while not Path({str(tmp_path / other)!r}).exists():
                if time.monotonic() > deadline:
                    raise SystemExit("{name}: the other tier never started")
                time.sleep(0.05)
            print("{name} ran")
            raise SystemExit({1 if name == "e2e" else 0})
        """)
        return subprocess.Popen([sys.executable, "-c", script], stdout=output, stderr=subprocess.STDOUT)

    monkeypatch.setattr(launcher, "in_namespaces", stand_in)
    monkeypatch.setattr(launcher, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(launcher, "TIERS", tmp_path / "tiers")
    assert launcher.side_by_side() == 1  # e2e's stand-in fails
    printed = capsys.readouterr().out
    assert printed.index("--- python -m tools.control_plane test (exit status 0) ---\ntest ran") < \
        printed.index("--- python -m tools.control_plane e2e (exit status 1) ---\ne2e ran"), printed


def test_a_program_dies_with_the_process_that_started_it(tmp_path):
    """A tier whose pytest is killed (no teardown) leaves no controller running."""
    starter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tools.control_plane.processes import Program
        program = Program("sleeper", ["sleep", "60"], Path({str(tmp_path / "sleeper.log")!r})).start()
        print(program.process.pid, flush=True)
        time.sleep(60)
    """)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    sleeper = int(starter.stdout.readline())
    os.kill(sleeper, 0)  # running
    starter.kill()
    starter.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{sleeper}").exists() and \
            Path(f"/proc/{sleeper}/stat").read_text().split()[2] != "Z":
        time.sleep(0.05)
    assert not Path(f"/proc/{sleeper}").exists() or \
        Path(f"/proc/{sleeper}/stat").read_text().split()[2] == "Z"


def test_the_real_nodes_runtime_keeps_its_state_in_the_tiers_directory(tmp_path):
    """containerd's root, state, socket and CNI configuration, and the pods' address leases, are the
    tier's; its pods' sandbox is the pause image the node loads; runc runs them under cgroupfs, as the
    kubelet is configured."""
    import tomllib

    from tools.control_plane.nodes import real

    config = tomllib.loads(real.containerd_config(tmp_path, tmp_path / "c.sock", "registry.k8s.io/pause:3"))
    assert (config["root"], config["state"], config["grpc"]["address"]) == (
        str(tmp_path / "root"), str(tmp_path / "state"), str(tmp_path / "c.sock"))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3"
    assert cri["cni"]["conf_dir"] == str(tmp_path / "cni")
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    network = real.cni_network(tmp_path)
    bridge = network["plugins"][0]
    assert bridge["bridge"] == real.BRIDGE and bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")
    (addresses,) = bridge["ipam"]["ranges"][0:1]
    assert addresses[0]["gateway"] == real.BRIDGE_ADDRESS  # the bridge's own address: the plugin keeps it


def test_a_pull_from_outside_the_tiers_registry_is_refused_on_the_node_and_named(tmp_path):
    """containerd sends every registry but the tier's to a closed port of its own, and the node names
    each reference the kubelet asked for elsewhere, from containerd's log."""
    from tools.control_plane.nodes import real

    hosts = real.registry_hosts(tmp_path / "certs.d", ("10.244.0.1:5000",))
    assert (hosts / "_default" / "hosts.toml").read_text() == f'server = "http://{real.CLOSED_REGISTRY}"\n'
    assert "http://10.244.0.1:5000" in (hosts / "10.244.0.1:5000" / "hosts.toml").read_text()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "containerd.log").write_text(
        'time="t" level=info msg="PullImage \\"10.244.0.1:5000/kueue/kueue:v0.19.2\\""\n'
        'time="t" level=info msg="PullImage \\"docker.io/dist-ml/serving:never-built\\""\n'
        'time="t" level=error msg="PullImage \\"docker.io/dist-ml/serving:never-built\\" failed"\n')
    node = real.RealNode(tmp_path, None, None, "node", {}, None, registries=("10.244.0.1:5000",))
    assert node.pulls_outside() == ["docker.io/dist-ml/serving:never-built"]


def test_the_kubelet_serves_the_stacks_cluster_domain_from_its_own_cgroup_root(tmp_path):
    from common.cluster_names import CLUSTER_DOMAIN
    from tools.control_plane import pki
    from tools.control_plane.nodes import real

    certificates = pki.make(tmp_path / "pki")
    serving = pki.issue_serving(certificates, tmp_path / "pki", "kubelet", ("10.244.0.1",))
    config = real.kubelet_config(tmp_path, certificates, serving, tmp_path / "c.sock", "/dist-ml-tier-1")
    assert config["clusterDomain"] == CLUSTER_DOMAIN and config["clusterDNS"] == [real.DNS_ADDRESS]
    assert config["cgroupRoot"] == "/dist-ml-tier-1" and config["cgroupDriver"] == "cgroupfs"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert f"kubernetes {CLUSTER_DOMAIN} " in real.corefile(tmp_path / "admin.kubeconfig")


def test_the_nodes_cgroup_is_made_in_every_hierarchy_and_removed_with_its_processes(tmp_path):
    from tools.control_plane.nodes import real

    for controller in ("cpu", "memory"):
        (tmp_path / "v1" / controller).mkdir(parents=True)
        (tmp_path / "v1" / controller / "cgroup.procs").write_text("")
    (tmp_path / "v1" / "cpu,cpuacct").symlink_to(tmp_path / "v1" / "cpu")
    assert real.cgroup_dirs("tier", tmp_path / "v1") == [tmp_path / "v1" / "cpu" / "tier",
                                                         tmp_path / "v1" / "memory" / "tier"]
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpu memory")
    assert real.cgroup_dirs("tier", tmp_path / "v2") == [tmp_path / "v2" / "tier"]
    sleeper = subprocess.Popen(["sleep", "60"])
    pod = tmp_path / "v1" / "cpu" / "tier" / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (pod / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    real.kill_cgroup_trees([tmp_path / "v1" / "cpu" / "tier"])
    assert sleeper.wait(timeout=5) == -9
    # (a real cgroup directory goes with rmdir while it holds only the kernel's files; here they are ours)


def test_coredns_and_the_pause_image_are_the_versions_kubeadm_of_our_kubernetes_installs(tmp_path):
    constants = tmp_path / components.KUBEADM_CONSTANTS
    constants.parent.mkdir(parents=True)
    constants.write_text('const (\n\tCoreDNSVersion = "v1.12.0"\n\tPauseVersion = "3.10"\n)\n')
    assert components.kubeadm_constant(tmp_path, "CoreDNSVersion") == "v1.12.0"
    with pytest.raises(components.PinError, match="EtcdVersion"):
        components.kubeadm_constant(tmp_path, "EtcdVersion")


def test_the_node_knows_the_machines_root_from_a_user_namespaces(tmp_path):
    from tools.control_plane.nodes import real

    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0          0 4294967295\n")
    assert real.real_root(uid_map)
    uid_map.write_text("         0       1000          1\n")  # unshare --user --map-root-user
    assert not real.real_root(uid_map)


def test_the_disk_a_directory_takes_counts_a_hard_linked_file_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100_000)
    os.link(tmp_path / "a", tmp_path / "b")
    (tmp_path / "c").symlink_to(tmp_path / "a")
    counted = build.disk_bytes(tmp_path)
    assert 100_000 <= counted < 200_000
    assert build.shown_bytes(2_345_000_000) == "2.3 GB" and build.shown_bytes(12_400_000) == "12 MB"


def test_the_tiers_directories_leave_room_for_the_nodes_unix_sockets():
    """A unix socket's path may not pass 107 bytes; the kubelet's deepest is its pod resources'."""
    deepest = launcher.tier_directory("e2e") / "control-plane0/node/kubelet/root/pod-resources/kubelet.sock"
    assert len(str(deepest)) <= 107, deepest


def test_a_tiers_run_keeps_its_state_in_a_directory_emptied_but_for_its_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "TIERS", tmp_path / "tiers")
    assert launcher.tier_directory("e2e") == tmp_path / "tiers" / "e2e_node"
    assert launcher.tier_directory("up") == tmp_path / "tiers" / "up"
    assert f"--basetemp={tmp_path / 'tiers' / 'cluster'}" in launcher.pytest_command("test", "-k", "x")
    run = launcher.tier_directory("e2e") / "control-plane0"
    kept = [run / "logs" / "etcd.log", run / "node" / "kubelet" / "pod-logs" / "ns_pod_1" / "main" / "0.log",
            run.parent / "test_scaling0" / "targets.json"]
    gone = [run / "etcd" / "member" / "wal" / "0.wal", run / "pulumi" / "state" / "stack.json",
            run / "node" / "storage" / "pvc-data" / "model.keras", run / "admin.kubeconfig"]
    for path in [*kept, *gone]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10_000)
    (run / "linked").symlink_to(run / "etcd", target_is_directory=True)
    assert launcher.finished("e2e", 3) == 3
    assert all(path.is_file() for path in kept) and not any(path.exists() for path in gone)
    assert sorted(path.name for path in run.iterdir()) == ["logs", "node"]  # empty directories gone too


def test_the_real_nodes_store_loses_every_name_of_each_image_the_run_does_not_use():
    """An image the run uses keeps all its names (the CRI plugin's digest and ID names with its tag);
    one it does not use loses them all, so that containerd's collector drops its content."""
    from tools.control_plane.nodes import real

    serving = "10.244.0.1:5000/dist-ml/serving"
    images = [(f"{serving}:new", "sha256:n"), (f"{serving}@sha256:n", "sha256:n"), ("sha256:c0", "sha256:n"),
              (f"{serving}:old", "sha256:o"), ("sha256:c1", "sha256:o"),
              ("registry.k8s.io/pause:3.9", "sha256:p")]
    kind = "application/vnd.docker.distribution.manifest.v2+json"
    listing = "REF  TYPE  DIGEST  SIZE  PLATFORMS  LABELS\n" + "".join(
        f"{name}  {kind}  {digest}  2.8 GiB  linux/amd64  io.cri-containerd.image=managed\n"
        for name, digest in images)
    listed = real.listed_in_store(listing)
    assert listed == images
    used = {f"{serving}:new", "registry.k8s.io/pause:3.10.1"}
    assert real.stale_in_store(listed, used) == [f"{serving}:old", "sha256:c1", "registry.k8s.io/pause:3.9"]


def test_the_real_node_uses_its_own_images_and_the_registrys_names_of_the_others(tmp_path):
    from tools.control_plane.nodes import images, real

    manifest = images.ImageManifest([
        images.BuiltImage("pause", "registry.k8s.io/pause:3.10.1", "a", images.NODE),
        images.BuiltImage("serving", "docker.io/dist-ml/serving:1", "b", images.PROJECT),
        images.BuiltImage("kueue", "registry.k8s.io/kueue/kueue:v0.19.2", "c", images.PLATFORM)])
    node = real.RealNode(tmp_path, None, None, "n", {}, manifest, registries=("10.244.0.1:5000",))
    assert node.used_names() == {"registry.k8s.io/pause:3.10.1", "10.244.0.1:5000/dist-ml/serving:1",
                                 "10.244.0.1:5000/kueue/kueue:v0.19.2"}


def test_a_shared_store_is_held_by_one_process_at_a_time(tmp_path):
    store = tmp_path / "node-containerd"
    first = build.held_alone(store)
    assert first is not None and store.is_dir()
    taken = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from tools.control_plane.build import held_alone
        print(held_alone(Path({str(store)!r})) is None)""")], capture_output=True, text=True, cwd=build.ROOT)
    assert taken.stdout.strip() == "True", taken.stderr
    first.close()
    assert build.held_alone(store) is not None
