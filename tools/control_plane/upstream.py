"""The upstream controllers, each started as a process against the tier's API server, with what its
install puts in the cluster, rendered by upstream's own tools from the module the tier built it from:
JobSet's release manifests (`kustomize build config/default`, what Trainer's overlay installs),
Trainer's CRDs and webhooks (its manifests/base), Kueue's and KServe's charts (`helm template` with
the values our stack renders), Argo's cluster install, KEDA's config/, KWOK's stages.

What a pod would give a controller, the tier gives the process instead, and nothing else differs:
- certificates: the tier's serving certificate in the directory each reads (its flag, its config, or
  controller-runtime's default under $TMPDIR); the controllers' own certificate rotation is off;
- webhook configurations as upstream registers them, but each `clientConfig.service` becomes the URL
  of the process on 127.0.0.1 with the tier's CA (no Service routes here), and every failurePolicy is
  Fail, so that no webhook that is down can let an object through (KEDA registers Ignore);
- each program's ports, so that they do not collide in one network namespace;
- the admin's kubeconfig (system:masters) as the identity of every controller but Argo's, which runs
  as its own service account with the rights its install grants (the stacks add its memo cache's).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Callable

import yaml

from engines.trainjob import KUEUE_NAMESPACE, TRAINER_NAMESPACE
from infra.keda import NAMESPACE as KEDA_NAMESPACE
from infra.platform import KSERVE_NAMESPACE
from pipeline.argo import ARGO_NAMESPACE
from tools.control_plane.build import Built
from tools.control_plane.pki import Pki, issue_serving

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")


@dataclasses.dataclass(frozen=True)
class Ports:
    webhook: int
    health: int


# One pair per controller, distinct in the tier's one network namespace.
PORTS = {
    "jobset": Ports(9441, 8091),
    "trainer": Ports(9442, 8092),
    "kueue": Ports(9443, 8093),
    "kserve": Ports(9444, 8094),
    "keda-webhooks": Ports(9445, 8095),
    "keda-operator": Ports(0, 8096),
    "keda-adapter": Ports(9446, 8097),  # its aggregated API (its Service's endpoint), its /metrics
}
ARGO_HEALTH_PORT = 6060  # fixed in the workflow controller
KEDA_GRPC_PORT = 9666
PROVISIONING_REQUEST_CRD = Path("config", "crd", "autoscaling.x-k8s.io_provisioningrequests.yaml")


def load_all(text: str) -> list[dict]:
    # libyaml's loader: the full CRDs are megabytes (Argo's, KServe's), five times faster to read.
    return [document for document in yaml.load_all(text, Loader=yaml.CSafeLoader) if document]


def kustomize(kubectl: str, directory: Path) -> list[dict]:
    """`kubectl kustomize` (kustomize built into kubectl) of an upstream directory."""
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return load_all(done.stdout)


def helm_template(
    helm: str, chart: Path, release: str, namespace: str, values: dict, work: Path
) -> list[dict]:
    """`helm template` of an upstream chart with `values`, as Pulumi's helm.v4.Chart renders it."""
    values_file = work / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    done = subprocess.run(
        [helm, "template", release, str(chart), "--namespace", namespace, "--values", str(values_file)],
        capture_output=True,
        text=True,
        check=False,
        env={"HOME": str(work), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template {chart}: {done.stderr.strip()}")
    return load_all(done.stdout)


def of_kind(objects: list[dict], *kinds: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] in kinds]


def served_by(configurations: list[dict], port: int, ca: bytes) -> list[dict]:
    """Webhook configurations calling the process on 127.0.0.1:`port` (their service's path kept)."""
    routed = []
    for configuration in configurations:
        configuration = copy.deepcopy(configuration)
        configuration["metadata"].pop("annotations", None)  # cert-manager's CA injection
        for webhook in configuration["webhooks"]:
            path = (webhook["clientConfig"].get("service") or {}).get("path", "/")
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            webhook["failurePolicy"] = "Fail"
        routed.append(configuration)
    return routed


def conversion_served_by(crds: list[dict], port: int, ca: bytes) -> list[dict]:
    """CRDs whose conversion webhook (if any) calls the process on 127.0.0.1:`port`."""
    routed = []
    for crd in crds:
        crd = copy.deepcopy(crd)
        webhook = (crd["spec"].get("conversion") or {}).get("webhook") or {}
        if webhook.get("clientConfig", {}).get("service"):
            path = webhook["clientConfig"]["service"].get("path", "/convert")
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
        routed.append(crd)
    return routed


def in_namespace(manifest: dict, namespace: str) -> dict:
    """A namespaced object of a chart's with the release's namespace, as `helm install` puts it there."""
    return {**manifest, "metadata": {"namespace": namespace, **manifest["metadata"]}}


def deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        merged[key] = (
            deep_merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def serving_cert_dir(directory: Path, pki: Pki, with_ca: bool = False) -> Path:
    """A directory holding the tier's serving certificate as tls.crt and tls.key (and ca.crt)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(pki.serving.cert.read_bytes())
    (directory / "tls.key").write_bytes(pki.serving.key.read_bytes())
    if with_ca:
        (directory / "ca.crt").write_bytes(pki.ca_pem)
    return directory


def manager_config(ctx: Context, name: str, upstream: dict, leader_election_namespace: str,
                   cert_management: str, cert_dir: Path | None = None, **more: object) -> Path:
    """The config file of the controller-runtime manager `name` (its ControllerManagerConfiguration):
    upstream's with what a pod would give the process instead, `more` over it, written in the tier's
    directory. Its webhook server and health probe on 127.0.0.1 at PORTS[name], its metrics server off,
    its leader election's lease in `leader_election_namespace`, its own certificate rotation (the key
    `cert_management`) off: its webhook server reads the tier's certificate from `cert_dir` (or from
    controller-runtime's default directory, when None)."""
    ports = PORTS[name]
    webhook = {"host": "127.0.0.1", "port": ports.webhook, **({"certDir": str(cert_dir)} if cert_dir else {})}
    overrides = {
        "leaderElection": {"resourceNamespace": leader_election_namespace},
        cert_management: {"enable": False},
        "webhook": webhook,
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        **more,
    }
    config_file = ctx.work / f"{name}-config.yaml"
    config_file.write_text(yaml.safe_dump(deep_merge(upstream, overrides)))
    return config_file


@dataclasses.dataclass(frozen=True)
class Controller:
    """One upstream program as the tier runs it."""

    name: str
    component: str
    args: list[str]
    env: dict[str, str]
    ready_url: str  # its readiness check on 127.0.0.1 (plain HTTP, or HTTPS with the tier's CA)


@dataclasses.dataclass
class Install:
    """What the tier applies for the upstream installs, in order, and the controllers it starts."""

    crds: list[dict] = dataclasses.field(default_factory=list)
    before: list[dict] = dataclasses.field(default_factory=list)  # config and RBAC, before the controllers
    webhooks: list[dict] = dataclasses.field(default_factory=list)  # once the controllers answer
    after: list[dict] = dataclasses.field(default_factory=list)  # objects upstream's webhooks check
    controllers: list[Controller] = dataclasses.field(default_factory=list)

    def add(self, other: Install) -> None:
        for field in dataclasses.fields(self):
            getattr(self, field.name).extend(getattr(other, field.name))


@dataclasses.dataclass(frozen=True)
class Context:
    """What every install needs: the programs, the modules' sources, certificates and a directory."""

    components: dict[str, Built]
    programs: Callable[[str], str]  # program name -> executable
    pki: Pki
    work: Path
    admin_kubeconfig: Path
    rendered: dict  # chart name -> the values our stack renders for it ("kueue", "kserve-resources", ...)

    def module(self, component: str) -> Path:
        return Path(self.components[component].module_dir)

    def health(self, name: str) -> str:
        return f"http://127.0.0.1:{PORTS[name].health}/readyz"


def jobset(ctx: Context) -> Install:
    release = kustomize(ctx.programs("kubectl"), ctx.module("jobset") / "config" / "default")
    (config_map,) = [
        obj for obj in release if obj["kind"] == "ConfigMap" and "manager-config" in obj["metadata"]["name"]
    ]
    (config_text,) = config_map["data"].values()
    certs = serving_cert_dir(ctx.work / "jobset-certs", ctx.pki)
    config_file = manager_config(ctx, "jobset", yaml.safe_load(config_text), TRAINER_NAMESPACE,
                                 "internalCertManagement", certs)
    return Install(
        crds=of_kind(release, "CustomResourceDefinition"),
        webhooks=served_by(of_kind(release, *WEBHOOK_KINDS), PORTS["jobset"].webhook, ctx.pki.ca_pem),
        controllers=[
            Controller(
                "jobset",
                "jobset",
                [f"--kubeconfig={ctx.admin_kubeconfig}", f"--config={config_file}", "--zap-log-level=2"],
                {},
                ctx.health("jobset"),
            )
        ],
    )


def trainer(ctx: Context) -> Install:
    base = ctx.module("trainer") / "manifests" / "base"
    kubectl = ctx.programs("kubectl")
    upstream = yaml.safe_load((base / "manager" / "controller_manager_config.yaml").read_text())
    config_file = manager_config(ctx, "trainer", upstream, TRAINER_NAMESPACE, "certManagement")
    # Trainer's webhook server reads controller-runtime's default directory, under $TMPDIR.
    tmpdir = ctx.work / "trainer-tmp"
    serving_cert_dir(tmpdir / "k8s-webhook-server" / "serving-certs", ctx.pki)
    return Install(
        crds=kustomize(kubectl, base / "crds"),
        webhooks=served_by(kustomize(kubectl, base / "webhook"), PORTS["trainer"].webhook, ctx.pki.ca_pem),
        controllers=[
            Controller(
                "trainer-controller-manager",
                "trainer",
                [f"--kubeconfig={ctx.admin_kubeconfig}", f"--config={config_file}", "--zap-log-level=2"],
                {"TMPDIR": str(tmpdir)},
                ctx.health("trainer"),
            )
        ],
    )


def kueue(ctx: Context) -> Install:
    """Kueue's chart with the Configuration our stack renders (engines.trainjob.kueue_manager_config),
    the manager's process settings over it."""
    chart = helm_template(
        ctx.programs("helm"),
        ctx.module("kueue") / "charts" / "kueue",
        "kueue",
        KUEUE_NAMESPACE,
        ctx.rendered["kueue"],
        ctx.work,
    )
    ports = PORTS["kueue"]
    (config_map,) = [
        obj
        for obj in chart
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith("manager-config")
    ]
    certs = serving_cert_dir(ctx.work / "kueue-certs", ctx.pki)
    config_file = manager_config(
        ctx, "kueue", yaml.safe_load(config_map["data"]["controller_manager_config.yaml"]), KUEUE_NAMESPACE,
        "internalCertManagement", certs, namespace=KUEUE_NAMESPACE,
        # Its visibility API server needs a Service and certificates at a fixed path; nothing uses it.
        featureGates={"VisibilityOnDemand": False},
    )
    # Read even when its metrics server is off (v0.19.2 cmd/kueue/main.go); /etc is the tier's overlay.
    serving_cert_dir(Path("/etc/kueue/metrics/certs"), ctx.pki)
    return Install(
        # With the autoscaler's ProvisioningRequest served before Kueue starts, as GKE serves it, Kueue
        # runs its provisioning admission check controller (the gke stack's queued GPUs).
        crds=[*conversion_served_by(of_kind(chart, "CustomResourceDefinition"), ports.webhook,
                                    ctx.pki.ca_pem),
              *load_all(ctx.module("autoscaler-apis").joinpath(PROVISIONING_REQUEST_CRD).read_text())],
        webhooks=served_by(of_kind(chart, *WEBHOOK_KINDS), ports.webhook, ctx.pki.ca_pem),
        controllers=[
            Controller(
                "kueue",
                "kueue",
                [f"--kubeconfig={ctx.admin_kubeconfig}", f"--config={config_file}", "--zap-log-level=2"],
                {},
                ctx.health("kueue"),
            )
        ],
    )


def metrics_adapter_objects(objects: list[dict], address: str, port: int, ca: bytes) -> list[dict]:
    """KEDA's APIService and its Service (config/metrics-server), as the adapter's process at
    `address`:`port` serves them: the APIService with the tier's CA, the Service without a selector
    and its Endpoints the process."""
    kept = []
    for obj in copy.deepcopy(objects):
        if obj["kind"] == "APIService":
            obj["spec"]["caBundle"] = base64.b64encode(ca).decode()
        if obj["kind"] == "Service":
            obj["spec"].pop("selector")
            obj["spec"]["ports"] = [{**served, "targetPort": port} for served in obj["spec"]["ports"]
                                    if served["name"] == "https"]
            kept.append({"apiVersion": "v1", "kind": "Endpoints", "metadata": dict(obj["metadata"]),
                         "subsets": [{"addresses": [{"ip": address}],
                                      "ports": [{"name": "https", "port": port}]}]})
        kept.append(obj)
    return kept


def keda(ctx: Context, adapter_address: str) -> Install:
    """KEDA's operator, its admission webhooks and its metrics adapter (the external metrics API the
    HPA controller reads, served through the API server's aggregation layer from `adapter_address`)."""
    module = ctx.module("keda") / "config"
    kubectl = ctx.programs("kubectl")
    operator, webhooks, adapter = PORTS["keda-operator"], PORTS["keda-webhooks"], PORTS["keda-adapter"]
    certs = serving_cert_dir(ctx.work / "keda-certs", ctx.pki, with_ca=True)
    metrics_server = kustomize(kubectl, module / "metrics-server")
    (service,) = of_kind(metrics_server, "Service")
    service_name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    # The adapter serves the aggregation layer (which checks the Service's name) and is a gRPC client
    # of the operator (which asks for a client certificate of the CA in its ca.crt): one certificate.
    adapter_certs = ctx.work / "keda-adapter-certs"  # its --cert-dir: the gRPC client's ca.crt, tls.*
    adapter_pair = issue_serving(ctx.pki, adapter_certs, "tls", ("127.0.0.1", adapter_address),
                                 dns=(service_name, "localhost"), client=True)
    (adapter_certs / "ca.crt").write_bytes(ctx.pki.ca_pem)
    env = {
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": KEDA_NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
    }
    common = [
        f"--kubeconfig={ctx.admin_kubeconfig}",
        "--metrics-bind-address=0",
        f"--cert-dir={certs}",
        "--zap-log-level=info",
    ]
    return Install(
        crds=kustomize(kubectl, module / "crd"),
        webhooks=served_by(
            of_kind(kustomize(kubectl, module / "webhooks"), *WEBHOOK_KINDS), webhooks.webhook, ctx.pki.ca_pem
        ),
        controllers=[
            Controller(
                "operator",
                "keda",
                [
                    *common,
                    f"--health-probe-bind-address=127.0.0.1:{operator.health}",
                    f"--metrics-service-bind-address=127.0.0.1:{KEDA_GRPC_PORT}",
                    "--enable-webhook-patching=false",
                ],
                env,
                ctx.health("keda-operator"),
            ),
            Controller(
                "webhooks",
                "keda",
                [
                    *common,
                    f"--health-probe-bind-address=127.0.0.1:{webhooks.health}",
                    f"--port={webhooks.webhook}",
                ],
                env,
                ctx.health("keda-webhooks"),
            ),
            # Outside a pod, each of its clients needs the kubeconfig named (v2.21.0 cmd/adapter/main.go).
            Controller(
                "adapter",
                "keda",
                [
                    *(f"--{client}kubeconfig={ctx.admin_kubeconfig}"
                      for client in ("", "lister-", "authentication-", "authorization-")),
                    f"--cert-dir={adapter_certs}",
                    f"--tls-cert-file={adapter_pair.cert}",
                    f"--tls-private-key-file={adapter_pair.key}",
                    f"--secure-port={adapter.webhook}",
                    f"--port={adapter.health}",
                    f"--metrics-service-address=127.0.0.1:{KEDA_GRPC_PORT}",
                ],
                env,
                f"https://127.0.0.1:{adapter.webhook}/readyz",
            ),
        ],
        before=of_kind(metrics_server, *RBAC_KINDS),
        after=metrics_adapter_objects(of_kind(metrics_server, "APIService", "Service"), adapter_address,
                                      adapter.webhook, ctx.pki.ca_pem),
    )


def kserve(ctx: Context) -> Install:
    """KServe's three charts with the values our stack renders; its controller reads the
    inferenceservice-config the chart makes of them."""
    charts = ctx.module("kserve") / "charts"
    helm = ctx.programs("helm")
    crds = helm_template(helm, charts / "kserve-crd", "kserve-crd", KSERVE_NAMESPACE, {}, ctx.work)
    resources = helm_template(
        helm,
        charts / "kserve-resources",
        "kserve-resources",
        KSERVE_NAMESPACE,
        ctx.rendered["kserve-resources"],
        ctx.work,
    )
    runtimes = helm_template(
        helm,
        charts / "kserve-runtime-configs",
        "kserve-runtime-configs",
        KSERVE_NAMESPACE,
        ctx.rendered["kserve-runtime-configs"],
        ctx.work,
    )
    ports = PORTS["kserve"]
    tmpdir = ctx.work / "kserve-tmp"
    serving_cert_dir(tmpdir / "k8s-webhook-server" / "serving-certs", ctx.pki)
    return Install(
        crds=of_kind(crds, "CustomResourceDefinition"),
        before=[in_namespace(config_map, KSERVE_NAMESPACE) for config_map in of_kind(resources, "ConfigMap")],
        webhooks=served_by(of_kind(resources, *WEBHOOK_KINDS), ports.webhook, ctx.pki.ca_pem),
        after=[*of_kind(resources, "ClusterStorageContainer"), *of_kind(runtimes, "ClusterServingRuntime")],
        controllers=[
            Controller(
                "manager",
                "kserve",
                [
                    f"--kubeconfig={ctx.admin_kubeconfig}",
                    "--metrics-addr=0",
                    f"--webhook-port={ports.webhook}",
                    f"--health-probe-addr=127.0.0.1:{ports.health}",
                    "--zap-log-level=info",
                ],
                {"POD_NAMESPACE": KSERVE_NAMESPACE, "TMPDIR": str(tmpdir)},
                ctx.health("kserve"),
            )
        ],
    )


def argo(ctx: Context, v4_crds: list[dict], controller_kubeconfig: Path) -> Install:
    """Argo's cluster install (CRDs, its controller's RBAC and config map); the workflows and
    workflow templates CRDs of the release the stacks install over the module's own."""
    install = kustomize(ctx.programs("kubectl"), ctx.module("argo") / "manifests" / "cluster-install")
    pinned = {crd["metadata"]["name"]: crd for crd in v4_crds}
    crds = [pinned.get(crd["metadata"]["name"], crd) for crd in of_kind(install, "CustomResourceDefinition")]
    for obj in install:
        if obj["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            obj["metadata"].setdefault(
                "namespace", ARGO_NAMESPACE
            )  # `kubectl apply -n argo`, as the stacks do
    return Install(
        crds=crds,
        before=[*of_kind(install, *RBAC_KINDS), *of_kind(install, "ConfigMap")],
        controllers=[
            Controller(
                "workflow-controller",
                "argo",
                [
                    f"--kubeconfig={controller_kubeconfig}",
                    f"--namespace={ARGO_NAMESPACE}",
                    "--loglevel=info",
                ],
                {"LEADER_ELECTION_DISABLE": "true"},
                f"http://127.0.0.1:{ARGO_HEALTH_PORT}/healthz",
            )
        ],
    )


def rendered_chart_values(stack_resources) -> dict:
    """The values our stack gives each chart it installs, by chart name, from the stack's render."""
    values = {}
    for resource in stack_resources:
        if resource.type == "kubernetes:helm.sh/v4:Chart":
            chart = str(resource.inputs["chart"]).rstrip("/").rpartition("/")[2]
            values[chart] = json.loads(json.dumps(resource.inputs.get("values") or {}))
    return values


# rancher/local-path-provisioner's own install (deploy/local-path-storage.yaml): its namespace, account,
# RBAC, the `local-path` StorageClass k3s' stacks name, and the config map it reads at start.
LOCAL_PATH_DEPLOY = Path("deploy", "local-path-storage.yaml")
LOCAL_PATH_CONFIG = "local-path-config"
LOCAL_PATH_READY_LINE = "Provisioner started"  # its --debug line once the controller runs


@dataclasses.dataclass(frozen=True)
class LocalPath:
    """The provisioner's install and its command line (it has no health endpoint: its log says ready)."""

    objects: list[dict]
    args: list[str]


def local_path(module_dir: Path, storage: Path, kubeconfig: Path) -> LocalPath:
    """The upstream install (from the provisioner's module) with its Deployment left out (the tier runs
    its process) and its config's node path under `storage`, where the node's helper pods make each
    volume's directory."""
    install = load_all((module_dir / LOCAL_PATH_DEPLOY).read_text())
    (config,) = [obj for obj in of_kind(install, "ConfigMap") if obj["metadata"]["name"] == LOCAL_PATH_CONFIG]
    paths = json.loads(config["data"]["config.json"])
    for entry in paths["nodePathMap"]:
        entry["paths"] = [str(storage)]
    config["data"]["config.json"] = json.dumps(paths)
    (deployment,) = of_kind(install, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # Its command but the config file its pod mounts: without --config it reads the config map itself.
    command = container["command"][1:]
    at = command.index("--config")
    args = [*command[:at], *command[at + 2:], f"--kubeconfig={kubeconfig}",
            f"--namespace={deployment['metadata']['namespace']}"]
    return LocalPath([obj for obj in install if obj["kind"] != "Deployment"], args)


# kube-router's install for its own daemonset, whose ClusterRole grants what its controllers read.
KUBE_ROUTER_INSTALL = Path("daemonset", "generic-kuberouter.yaml")
KUBE_ROUTER_ROLE = "kube-router"


def kube_router_access(module_dir: Path, user: str) -> list[dict]:
    """kube-router's ClusterRole as its install grants it (from the module), bound to `user`: the
    client certificate the node's kube-router runs with, as kube-proxy runs with its own."""
    (role,) = [obj for obj in of_kind(load_all((module_dir / KUBE_ROUTER_INSTALL).read_text()), "ClusterRole")
               if obj["metadata"]["name"] == KUBE_ROUTER_ROLE]
    role["metadata"].pop("namespace", None)  # a cluster-scoped object: its manifest's namespace means nothing
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": KUBE_ROUTER_ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KUBE_ROUTER_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    return [role, binding]
