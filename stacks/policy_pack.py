"""stacks/policies.py's checks as the policy pack (policy/) runs them on `pulumi preview` and `up`:
over the resources a stack declares, as Pulumi's policy engine hands them over (a type token, a name
and the properties), each violation reported once. Kept free of pulumi_policy so that tests run it;
policy/__main__.py hands in the engine's UnknownValueError.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from stacks import policies
from stacks.declared import Declared, kubernetes_objects, plain


def declared(resources: Iterable[Any],
             unknown_error: type[Exception] | tuple[type[Exception], ...] = ()) -> list[Declared]:
    """Pulumi's policy resources (resource_type, name, props) in the policies' terms: the props read
    through the engine's proxies into plain data, each value unknown during preview as UNKNOWN."""
    return [Declared(resource.resource_type, resource.name, plain(resource.props or {}, unknown_error))
            for resource in resources]


Check = Callable[[Sequence[Declared]], list[str]]
# name -> (what it requires, the check over a stack's resources)
POLICIES: dict[str, tuple[str, Check]] = {
    "no-cluster-admin": ("no binding to cluster-admin",
                         lambda resources: policies.no_cluster_admin(kubernetes_objects(resources))),
    "requests-and-limits": ("CPU and memory requests and limits on every container, embedded ones too",
                            lambda resources: policies.requests_and_limits(kubernetes_objects(resources))),
    "pinned-images": ("every image pinned by a tag other than latest, or a digest",
                      lambda resources: policies.pinned_images(kubernetes_objects(resources))),
    "restricted-pods": ("every pod, embedded ones too, meets the restricted Pod Security Standard",
                        lambda resources: policies.restricted_pods(kubernetes_objects(resources))),
    "private-buckets": ("buckets private, uniform and versioned", policies.private_buckets),
    "no-service-account-keys": ("no service account keys: Workload Identity instead",
                                policies.no_service_account_keys),
    "private-databases": ("Cloud SQL without a public address, through the Auth Proxy, with IAM database "
                          "users only (no password)", policies.private_databases),
    "closed-clusters": ("GKE clusters with private nodes, a public endpoint (if any) open to named ranges "
                        "only, and NetworkPolicy enforced", policies.closed_clusters),
    "tested-kubernetes": ("the cluster's Kubernetes minor inside every installed controller's tested range",
                          policies.tested_kubernetes),
    "closed-firewalls": ("no ingress firewall rule open to everyone", policies.closed_firewalls),
    "public-endpoints": ("a public Gateway serves HTTPS only (plain HTTP only redirects) and every backend "
                         "behind it has an access control (a Cloud Armor allowlist denying the rest, or IAP)",
                         lambda resources: policies.public_endpoints(kubernetes_objects(resources),
                                                                     resources)),
}


def stack_validator(check: Check, unknown_error: type[Exception] | tuple[type[Exception], ...] = ()
                    ) -> Callable[[Any, Callable[[str, str | None], None]], None]:
    """A StackValidationPolicy's `validate` running `check` over the stack's resources."""

    def validate(args: Any, report_violation: Callable[[str, str | None], None]) -> None:
        for violation in check(declared(args.resources, unknown_error)):
            report_violation(violation, None)

    return validate
