"""`pulumi up` for real (conftest.py): the platform the stack installs runs as its own pods, under its
own accounts, its webhooks reached through their Services; an image no registry has fails `pulumi up`
in the kubelet's words; a second `up` changes nothing, and a diff that never settles is named; the
artifact directory holds each artifact at its pinned version."""

from __future__ import annotations

import json
import tarfile
import uuid
from pathlib import Path

import pulumi
import yaml
from e2e_stack import NAMESPACE, NEVER_STARTS_SECONDS, PLATFORM_NAMESPACES, WITHHELD

from engines.base import condition
from stacks.installs import platform_ports
from stacks.program import main as stack_program
from tools.control_plane import artifacts, components
from tools.control_plane.pulumi_stack import no_changes
from tools.control_plane.registry import ADDRESS as REGISTRY

# The controllers the stack installs, by the Deployment that runs each, in its namespace.
CONTROLLERS = {
    "kubeflow-system": ("jobset-controller-manager", "kubeflow-trainer-controller-manager"),
    "kueue-system": ("platform-kueue-controller-manager",),
    "kserve": ("kserve-controller-manager",),
    "keda": ("keda-operator", "keda-metrics-apiserver", "keda-admission"),
    "argo": ("workflow-controller", "argo-server"),
}
WEBHOOKS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CHANGING = "dist-ml/changes-on-every-run"


def test_every_platform_deployment_is_available_as_the_pods_it_installs(cluster, say):
    for namespace in PLATFORM_NAMESPACES:
        deployments = {deployment["metadata"]["name"]: deployment
                       for deployment in cluster.api.list("apps/v1", "Deployment", namespace)}
        assert set(CONTROLLERS[namespace]) <= set(deployments), (namespace, sorted(deployments))
        for name, deployment in deployments.items():
            available = condition(deployment, "Available")
            assert available is not None, f"{namespace}/{name}: {deployment.get('status')}"
        for pod in cluster.api.list("v1", "Pod", namespace):
            account = pod["spec"].get("serviceAccountName")
            assert account and account != "default", (namespace, pod["metadata"]["name"], account)
            images = [container["image"] for container in pod["spec"]["containers"]]
            assert all(image.startswith(f"{REGISTRY}/") for image in images), images


def test_every_webhook_is_reached_through_its_service_with_a_ca(cluster):
    """As the controllers' own manifests register them: a Service of the platform's namespaces, never a
    URL, and a CA bundle their certificate rotators (or cert-manager) wrote."""
    for kind in WEBHOOKS:
        for configuration in cluster.api.list("admissionregistration.k8s.io/v1", kind):
            for webhook in configuration.get("webhooks") or []:
                client = webhook["clientConfig"]
                assert "url" not in client and client["service"]["namespace"] in PLATFORM_NAMESPACES, webhook
                assert client.get("caBundle"), (configuration["metadata"]["name"], webhook["name"])


def target_port(api, service: dict) -> int:
    """The port in the pod that a webhook's or APIService's Service reference reaches: the Service
    port's targetPort, a name resolved through the Service's EndpointSlices as kube-proxy does."""
    found = api.get("v1", "Service", service["name"], service["namespace"])
    (port,) = [p for p in found["spec"]["ports"] if p["port"] == service.get("port", 443)]
    target = port.get("targetPort", port["port"])
    if isinstance(target, int):
        return target
    slices = api.list("discovery.k8s.io/v1", "EndpointSlice", service["namespace"],
                      label_selector=f"kubernetes.io/service-name={service['name']}")
    # An unnamed Service port's endpoint port has the name "" (or none).
    (number,) = {p["port"] for s in slices for p in s.get("ports") or []
                 if (p.get("name") or "") == (port.get("name") or "")}
    return number


def test_the_control_plane_calls_the_platform_on_exactly_the_ports_the_installs_name(cluster):
    """What a private GKE cluster's firewall opens to the control plane (infra/network.py): every
    webhook's and aggregated API's port in its pod is one the installs name, and each port they name
    is one the installed platform serves."""
    served: dict[int, list[str]] = {}
    for kind in WEBHOOKS:
        for configuration in cluster.api.list("admissionregistration.k8s.io/v1", kind):
            for webhook in configuration.get("webhooks") or []:
                port = target_port(cluster.api, webhook["clientConfig"]["service"])
                served.setdefault(port, []).append(f"{kind} {webhook['name']}")
    for api_service in cluster.api.list("apiregistration.k8s.io/v1", "APIService"):
        if api_service["spec"].get("service"):
            port = target_port(cluster.api, api_service["spec"]["service"])
            served.setdefault(port, []).append(f"APIService {api_service['metadata']['name']}")
    named = set(platform_ports(cluster.config))
    unopened = {port: callers for port, callers in served.items() if port not in named}
    assert not unopened, f"the installs do not name these ports, which the control plane calls: {unopened}"
    assert named <= set(served), f"named but served by no webhook or APIService: {named - set(served)}"


def test_an_image_nobody_built_fails_up_within_minutes_in_the_kubelets_words(cluster):
    """The first `pulumi up` ran before the registry had Kueue's image (conftest.WITHHELD)."""
    assert cluster.never_started_seconds < NEVER_STARTS_SECONDS, cluster.never_started
    image = WITHHELD.partition("/")[2]
    assert f"{REGISTRY}/{image}:" in cluster.never_started, cluster.never_started
    assert "ErrImagePull" in cluster.never_started or "ImagePullBackOff" in cluster.never_started


def test_the_second_up_created_what_the_first_did_not_and_a_third_changes_nothing(cluster):
    (second,) = cluster.updates
    assert second.changes.get("create"), second
    third = cluster.stack.up()
    assert not third.changed, third


def with_a_changing_annotation(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """Every Deployment our code declares (in the stack's namespace: the platform's are in their own)
    annotated anew on every run."""
    metadata = dict(args.props.get("metadata") or {})
    if args.type_ != DEPLOYMENT or metadata.get("namespace") != NAMESPACE:
        return None
    metadata["annotations"] = {**(metadata.get("annotations") or {}), CHANGING: uuid.uuid4().hex}
    return pulumi.ResourceTransformResult({**args.props, "metadata": metadata}, args.opts)


def test_a_diff_that_never_settles_is_named(cluster):
    """A preview of our Deployments (targeted: the third `up` has shown everything else settles, and
    the engine then diffs only these), each given an annotation that changes on every run."""
    def program() -> None:
        pulumi.runtime.register_resource_transform(with_a_changing_annotation)
        stack_program()

    ours = [resource for resource in cluster.stack.resources()
            if resource["kind"] == "Deployment" and resource["namespace"] == NAMESPACE]
    update, changed = cluster.stack.preview(program, targets=[resource["urn"] for resource in ours])
    try:
        no_changes(update, changed)
    except AssertionError as error:
        said = str(error)
    else:
        raise AssertionError(f"a changing annotation went unseen: {update}")
    assert ours and all(resource["resource"] in said for resource in ours), said
    assert CHANGING in said or "metadata" in said, said


def test_each_artifact_is_the_version_the_stack_pins(cluster):
    """Every file of each copy is its module's at the version the tier built (the module cache holds
    what the checksum database verified), but the edits its release would make, named; each module's
    version is the stack's pin, or a declared substitute's; a chart's Chart.yaml says the pin."""
    directory = cluster.tier.directory / "artifacts"
    provenance = json.loads((directory / artifacts.PROVENANCE).read_text())
    built = {item.module: item for item in cluster.tier.built}
    for artifact, source in provenance.items():
        module = built[source["module"]]
        assert source["version"] == module.version
        pinned = source["pinned"].removeprefix("v") == module.pinned.removeprefix("v")
        assert pinned or module.name in components.SUBSTITUTES, (artifact, source, module.pinned)
        original = Path(module.module_dir) / source["path"]
        copied = dict(artifact_files(directory / artifact, source["path"]))
        differing = sorted(name for name, data in copied.items()
                           if not (original / name).is_file() or (original / name).read_bytes() != data)
        assert differing == source["edits"], (artifact, differing, source["edits"])
        if artifact.endswith(".tgz"):
            assert yaml.safe_load(copied["Chart.yaml"])["version"] == source["pinned"], artifact


def artifact_files(path: Path, top: str):
    """(name under the module's `top`, bytes) of each file of a chart archive or a copied tree."""
    if path.name.endswith(".tgz"):
        with tarfile.open(path) as archive:
            for member in archive.getmembers():
                if member.isfile():
                    yield member.name.partition("/")[2], archive.extractfile(member).read()
        return
    for file in (path / top).rglob("*"):
        if file.is_file():
            yield str(file.relative_to(path / top)), file.read_bytes()
