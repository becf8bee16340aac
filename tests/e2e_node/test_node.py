"""The real node: pods that run in containerd with runc on the tier's bridge, their names resolved by
CoreDNS, their Services reached through kube-proxy, the kubelet's own refusals and kills, and each of
the project's images run as its own user."""

from __future__ import annotations

import urllib.request

import pytest

from common import pod_security
from common.cluster_names import CLUSTER_DOMAIN
from engines.base import condition
from infra.images import BASE_IMAGES, image_ref
from tools.control_plane import images
from tools.control_plane.node import NEVER_STARTS

NAMESPACE = "real-node"
RUN_SECONDS = 90.0
HTTP_PORT = 8080


@pytest.fixture(scope="module")
def on_node(cluster):
    """The e2e's real node, with a namespace of these tests' own (no Pod Security labels: the helper
    image runs as root)."""
    cluster.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return cluster.real_node


def helper_pod(real_node, name: str, script: str, **container: object) -> dict:
    """A pod of the busybox helper image on the real node, running `script` with sh."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
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


def container_state(tier, name: str) -> dict:
    pod = tier.api.get("v1", "Pod", name, NAMESPACE) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0]["state"] if statuses else {}


def finished(tier, name: str) -> dict:
    """The pod's container's terminated state, once it has one; the kubelet's own words at once if it
    says the container will never start."""

    def terminated():
        state = container_state(tier, name)
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        assert reason not in NEVER_STARTS, f"pod {name}: {reason}: {waiting.get('message')}"
        return state.get("terminated")

    return tier.api.wait(terminated, f"pod {name} ended", RUN_SECONDS)


def logs(tier, name: str) -> str:
    return tier.api.core.read_namespaced_pod_log(name, NAMESPACE)


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


def project_pod(real_node, name: str, image: str, *command: str) -> dict:
    """A pod of one of the project's images on the real node, with the restricted security context our
    pods declare (runAsNonRoot; the user is the image's USER)."""
    pod = helper_pod(real_node, name, "")
    (container,) = pod["spec"]["containers"]
    container.update(image=images.qualified(image_ref(image)), command=list(command),
                     securityContext=pod_security.container_security_context())
    pod["spec"]["securityContext"] = pod_security.pod_security_context()
    return pod


@pytest.mark.parametrize("image", BASE_IMAGES)
def test_each_project_image_runs_as_its_own_user_under_the_restricted_context(tier, on_node, image):
    """Built from its Dockerfile on the stand-in base: the kubelet starts it under runAsNonRoot (so its
    USER is not root), as uid 1000, on Python 3.11 with its own lock installed."""
    module = {"trainer": "trainer.train", "serving": "serving.server", "tracking-server": "mlflow"}[image]
    probe = f"import os, sys, {module}; print(os.getuid(), sys.version_info[:2])"
    name = f"image-{image}"
    tier.api.create(project_pod(on_node, name, image, "python", "-c", probe))
    ended = finished(tier, name)
    assert (ended["exitCode"], logs(tier, name).split("\n")[-2]) == (0, "1000 (3, 11)"), logs(tier, name)
