"""The real node: pods that run in containerd with runc on the tier's bridge, their names resolved by
CoreDNS, their Services reached through kube-proxy, the kubelet's own refusals and kills, and each of
the project's images run as its own user."""

from __future__ import annotations

import urllib.parse
import urllib.request

import pytest
from e2e_stack import NAMESPACE as PIPELINE_NAMESPACE  # the one the tracking server's NetworkPolicy admits
from e2e_stack import project_reference

from common import pod_security, tracking_names
from common.cluster_names import CLUSTER_DOMAIN
from engines.base import condition
from tools.control_plane.nodes.images import PROJECT, images_of
from tools.control_plane.nodes.real import NEVER_STARTS

NAMESPACE = "real-node"
RUN_SECONDS = 90.0
HTTP_PORT = 8080


@pytest.fixture(scope="module")
def on_node(cluster):
    """The e2e's real node, with a namespace of these tests' own (no Pod Security labels: the helper
    image runs as root)."""
    cluster.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return cluster.real_node


def helper_pod(real_node, name: str, script: str, namespace: str = NAMESPACE, **container: object) -> dict:
    """A pod of the busybox helper image on the real node, running `script` with sh."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "nodeName": real_node.name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": real_node.images.helper,
                    "command": ["sh", "-c", script],
                    # No registry answers: what the node's runtime holds is all there is (`:latest` would
                    # otherwise be pulled every time).
                    "imagePullPolicy": "IfNotPresent",
                    **container,
                }
            ],
        },
    }


def container_state(tier, name: str, namespace: str = NAMESPACE) -> dict:
    pod = tier.api.get("v1", "Pod", name, namespace) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0]["state"] if statuses else {}


def finished(tier, name: str, namespace: str = NAMESPACE) -> dict:
    """The pod's container's terminated state, once it has one; the kubelet's own words at once if it
    says the container will never start."""

    def terminated():
        state = container_state(tier, name, namespace)
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        assert reason not in NEVER_STARTS, f"pod {name}: {reason}: {waiting.get('message')}"
        return state.get("terminated")

    return tier.api.wait(terminated, f"pod {name} ended", RUN_SECONDS)


def logs(tier, name: str, namespace: str = NAMESPACE) -> str:
    return tier.api.core.read_namespaced_pod_log(name, namespace)


def test_a_pod_runs_in_containerd_and_resolves_the_cluster_domain_with_coredns(tier, on_node):
    tier.api.create(helper_pod(on_node, "resolver", f"nslookup kubernetes.default.svc.{CLUSTER_DOMAIN}"))
    ended = finished(tier, "resolver")
    output = logs(tier, "resolver")
    assert ended["exitCode"] == 0, output
    assert "10.96.0.1" in output, output


def test_a_service_is_reached_through_kube_proxy_from_a_pod_and_from_outside_the_pod_network(tier, on_node):
    serving = helper_pod(
        on_node, "web", f"echo served by the real node > /www/index.html && httpd -f -p {HTTP_PORT} -h /www",
        volumeMounts=[{"name": "www", "mountPath": "/www"}],
        readinessProbe={"httpGet": {"path": "/index.html", "port": HTTP_PORT}, "periodSeconds": 1},
    )
    serving["spec"]["volumes"] = [{"name": "www", "emptyDir": {}}]
    tier.api.create(serving)
    service = tier.api.create({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": HTTP_PORT}]},
    })

    def ready():
        return condition(tier.api.get("v1", "Pod", "web", NAMESPACE), "Ready")

    tier.api.wait(ready, "the web pod Ready through its probe", RUN_SECONDS)
    # busybox's nc, not its wget: the static wget crashes without the NSS files a scratch image lacks
    host = f"web.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"
    request = f"printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {host} 80"
    tier.api.create(helper_pod(on_node, "client", request))
    ended = finished(tier, "client")
    assert ended["exitCode"] == 0, logs(tier, "client")
    assert logs(tier, "client").splitlines()[-1] == "served by the real node", logs(tier, "client")
    # The tests' process is outside the pod network: kube-proxy's rules take it to the pod too.
    cluster_ip = service["spec"]["clusterIP"]
    with urllib.request.urlopen(f"http://{cluster_ip}/index.html", timeout=5) as response:
        assert response.read().decode().strip() == "served by the real node"


def test_the_kubelet_refuses_to_run_an_image_as_root_under_run_as_non_root(tier, on_node):
    """The helper image runs as root: a pod that asserts runAsNonRoot and leaves the user to the image
    never starts, with the kubelet's own message."""
    tier.api.create(helper_pod(on_node, "rooted", "true", securityContext={"runAsNonRoot": True}))

    def refused():
        waiting = container_state(tier, "rooted").get("waiting") or {}
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = tier.api.wait(refused, "the kubelet's refusal", RUN_SECONDS)
    assert "runAsNonRoot and image will run as root" in waiting["message"]


def test_a_container_over_its_memory_limit_is_oom_killed(tier, on_node):
    limits = {"memory": "16Mi", "cpu": "200m"}
    tier.api.create(
        helper_pod(
            on_node, "greedy", "head -c 67108864 /dev/zero | tail > /dev/null",
            resources={"limits": limits, "requests": limits},
        )
    )
    assert finished(tier, "greedy")["reason"] == "OOMKilled"


def project_pod(real_node, name: str, image: str, *command: str, namespace: str = NAMESPACE) -> dict:
    """A pod of one of the project's images on the real node, with the restricted security context our
    pods declare (runAsNonRoot; the user is the image's USER)."""
    pod = helper_pod(real_node, name, "", namespace)
    (container,) = pod["spec"]["containers"]
    container.update(image=project_reference(image), command=list(command),
                     securityContext=pod_security.container_security_context())
    pod["spec"]["securityContext"] = pod_security.pod_security_context()
    return pod


@pytest.mark.parametrize("image", images_of(PROJECT), ids=lambda image: image.key)
def test_each_project_image_runs_as_its_own_user_under_the_restricted_context(tier, on_node, image):
    """Built from its Dockerfile on the stand-in base: the kubelet starts it under runAsNonRoot (so its
    USER is not root), as uid 1000, on Python 3.11 with its own lock installed (its entry point's module
    imports)."""
    probe = f"import os, sys, {image.entry_module}; print(os.getuid(), sys.version_info[:2])"
    name = f"image-{image.key}"
    tier.api.create(project_pod(on_node, name, image.key, "python", "-c", probe))
    ended = finished(tier, name)
    assert (ended["exitCode"], logs(tier, name).split("\n")[-2]) == (0, "1000 (3, 11)"), logs(tier, name)


TRACKING_READY_SECONDS = 300.0  # its init container migrates a new database first
# A pod's request for the tracking server's health at the URL of its second argument, tried each second
# for as many seconds as its first says: a new pod's address reaches the policy's rules a moment after
# the pod starts (NetworkPolicy implementations admit a new pod's traffic once they have seen it).
REACH_TRACKING = (
    "import sys, time, urllib.request\n"
    "deadline, tries = time.monotonic() + float(sys.argv[1]), 0\n"
    "while True:\n"
    "    tries += 1\n"
    "    try:\n"
    "        answer = urllib.request.urlopen(sys.argv[2], timeout=5)\n"
    "        sys.exit(print(answer.status, 'at try', tries))\n"
    "    except OSError as error:\n"
    "        if time.monotonic() > deadline:\n"
    "            sys.exit(f'unreached: {error}')\n"
    "        time.sleep(1)\n"
)
INSIDE_SECONDS, OUTSIDE_SECONDS = 60, 15


def tracking_server_ready(tier) -> dict | None:
    for pod in tier.api.list("v1", "Pod", PIPELINE_NAMESPACE):
        if pod["metadata"].get("labels", {}).get("app.kubernetes.io/name") == tracking_names.SERVER_NAME:
            for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
                waiting = (status.get("state") or {}).get("waiting") or {}
                assert waiting.get("reason") not in NEVER_STARTS, f"{status['name']}: {waiting}"
            if condition(pod, "Ready"):
                return pod
    return None


def tracking_answers_from_the_node(tier) -> bool:
    service = tier.api.get("v1", "Service", tracking_names.SERVER_NAME, PIPELINE_NAMESPACE)
    address = f"http://{service['spec']['clusterIP']}:{tracking_names.SERVER_PORT}/health"
    host = urllib.parse.urlsplit(tracking_names.server_uri(PIPELINE_NAMESPACE)).netloc
    try:
        request = urllib.request.Request(address, headers={"Host": host})
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_the_tracking_server_admits_the_pipelines_namespace_alone_as_its_policy_says(tier, on_node, say):
    """The local stack's tracking server, Ready through its probes, behind its NetworkPolicy as k3s
    enforces it (kube-router's controller on the node): the same request from a pod of the pipeline's
    namespace is answered; from a pod of another namespace it is refused, by name or at the pod's address."""
    tier.api.wait(lambda: tracking_server_ready(tier), "the tracking server Ready", TRACKING_READY_SECONDS)
    # Answering through its Service from the node (which the policy admits, as it does the kubelet's
    # probes), so kube-proxy has its endpoint: a refusal below can only be the policy's.
    tier.api.wait(lambda: tracking_answers_from_the_node(tier), "the tracking server's Service answering",
                  RUN_SECONDS)
    server = tracking_server_ready(tier)
    by_name = f"{tracking_names.server_uri(PIPELINE_NAMESPACE)}/health"  # the pipeline's pods' URI
    by_address = f"http://{server['status']['podIP']}:{tracking_names.SERVER_PORT}/health"  # bridged
    tries = {  # pod: (namespace, seconds, url)
        "tracking-inside": (PIPELINE_NAMESPACE, INSIDE_SECONDS, by_name),
        "tracking-outside": (NAMESPACE, OUTSIDE_SECONDS, by_name),
        "tracking-outside-direct": (NAMESPACE, OUTSIDE_SECONDS, by_address),
    }
    for name, (namespace, seconds, url) in tries.items():
        tier.api.create(project_pod(on_node, name, "tracking-server", "python", "-c", REACH_TRACKING,
                                    str(seconds), url, namespace=namespace))
    said = {}
    for name, (namespace, _, _) in tries.items():
        said[name] = (finished(tier, name, namespace)["exitCode"], logs(tier, name, namespace).strip())
    say(f"tracking server: {said}")
    assert said["tracking-inside"][0] == 0 and said["tracking-inside"][1].startswith("200 at try"), said
    # kube-router rejects what no policy admits (ICMP port unreachable: refused, as kube-proxy would
    # refuse a Service without endpoints, which the node's answer above rules out), whether the packets
    # are routed to the Service or switched on the bridge to the pod.
    refused = (1, "unreached: <urlopen error [Errno 111] Connection refused>")
    assert said["tracking-outside"] == said["tracking-outside-direct"] == refused, said
