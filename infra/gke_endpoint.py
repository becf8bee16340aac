"""Where GKE's Gateway puts the model, closed by default: an internal load balancer that only the
cluster's VPC network reaches, unless the stack asks for a public endpoint, which is HTTPS only
(a Google-managed certificate for the stack's domain), with plain HTTP redirected, and behind a
Cloud Armor allowlist whose default rule denies. Standard library only: the stack (through
infra/gke_public_endpoint.py) and the policy pack (stacks/policies.py) read the same facts.

Facts from Google's docs, as checked when this was written:
- GatewayClasses (kubernetes-engine/docs/how-to/gatewayclass-capabilities): `gke-l7-rilb` is a
  regional internal Application Load Balancer; the external ones are `gke-l7-global-external-managed`,
  `gke-l7-regional-external-managed` and the classic `gke-l7-gxlb`, each with a multi-cluster `-mc`.
  A regional internal load balancer answers clients in its region unless a GCPGatewayPolicy turns
  on global access (configure-gateway-resources).
- The global external class takes its certificates from a Certificate Manager map named in the
  Gateway's `networking.gke.io/certmap` annotation, which must not be combined with
  `tls.certificateRefs` (how-to/secure-gateway); the HTTPS listener then has no `tls` block, which
  the Gateway API's own rules allow (HTTPS with `tls` needs mode Terminate; without, nothing).
- A GCPBackendPolicy (networking.gke.io/v1) in a Service's namespace, targeting that Service, sets
  the load balancer's backend service for it; `default.securityPolicy` names a Cloud Armor policy
  (secure-gateway). A Service without one gets a backend service without a policy: open.
- Cloud Armor: a policy created without rules gets a default rule (priority 2147483647) that ALLOWS
  everything, so the deny is declared; a basic (SRC_IPS_V1) rule matches at most 10 ranges (the
  Google provider validates it).
Not verified against a running cluster: that GKE programs the redirect route and the certificate
map as documented; `pulumi up` on GKE is the first real test (docs/guides/deploy-gke.md).
"""

from __future__ import annotations

INTERNAL_GATEWAY_CLASS = "gke-l7-rilb"
PUBLIC_GATEWAY_CLASS = "gke-l7-global-external-managed"
EXTERNAL_GATEWAY_CLASSES = frozenset({
    PUBLIC_GATEWAY_CLASS, "gke-l7-global-external-managed-mc", "gke-l7-regional-external-managed",
    "gke-l7-regional-external-managed-mc", "gke-l7-gxlb", "gke-l7-gxlb-mc"})
HTTP_PORT, HTTPS_PORT = 80, 443
CERTMAP_ANNOTATION = "networking.gke.io/certmap"
NAMED_ADDRESS = "NamedAddress"  # a Gateway address that names a reserved static address
BACKEND_POLICY_API = "networking.gke.io/v1"
BACKEND_POLICY_KIND = "GCPBackendPolicy"
BACKEND_POLICY_CRD = "gcpbackendpolicies.networking.gke.io"
# Cloud Armor
SECURITY_POLICY_TYPE = "CLOUD_ARMOR"  # a backend security policy
SOURCE_RANGES_MATCH = "SRC_IPS_V1"
DEFAULT_RULE_PRIORITY = 2147483647  # evaluated last: what happens to a request no other rule matched
ALLOWLIST_PRIORITY = 1000  # the first allow rule; the next ones follow
MAX_RANGES_PER_RULE = 10
ALLOW, DENY = "allow", "deny(403)"
EVERYONE = "*"


def allowlist_rules(source_ranges: tuple[str, ...]) -> list[dict]:
    """Cloud Armor rules (the Google provider's form) that let `source_ranges` in and deny the rest."""
    chunks = [source_ranges[start:start + MAX_RANGES_PER_RULE]
              for start in range(0, len(source_ranges), MAX_RANGES_PER_RULE)]
    allow = [{"priority": ALLOWLIST_PRIORITY + index, "action": ALLOW, "description": "allowed source ranges",
              "match": {"versioned_expr": SOURCE_RANGES_MATCH, "config": {"src_ip_ranges": list(chunk)}}}
             for index, chunk in enumerate(chunks)]
    deny = {"priority": DEFAULT_RULE_PRIORITY, "action": DENY, "description": "everyone else",
            "match": {"versioned_expr": SOURCE_RANGES_MATCH, "config": {"src_ip_ranges": [EVERYONE]}}}
    return [*allow, deny]


def backend_policy(namespace: str, service: str, security_policy: str, labels: dict[str, str]) -> dict:
    """The GCPBackendPolicy that puts the Cloud Armor policy `security_policy` in front of `service`."""
    return {"apiVersion": BACKEND_POLICY_API, "kind": BACKEND_POLICY_KIND,
            "metadata": {"name": service, "namespace": namespace, "labels": dict(labels)},
            "spec": {"targetRef": {"group": "", "kind": "Service", "name": service},
                     "default": {"securityPolicy": security_policy}}}
