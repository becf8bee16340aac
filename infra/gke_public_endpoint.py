"""The Google Cloud side of a public model endpoint on GKE (infra/gke_endpoint.py says why each part):
a reserved global address, a Google-managed certificate for the stack's domain in a certificate map,
and a Cloud Armor allowlist whose default rule denies.

Users publish two DNS records (the stack outputs them): the domain's A record, to the address, and
the DNS authorization's CNAME, by which Certificate Manager proves the domain is ours and issues the
certificate (before any traffic arrives, unlike a load balancer authorization).
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

from infra.gke_endpoint import SECURITY_POLICY_TYPE, allowlist_rules

CERTIFICATE_SCOPE = "DEFAULT"  # served by global external load balancers


@dataclasses.dataclass(frozen=True)
class PublicEndpointArgs:
    project: str
    name: str  # of every resource here (<cluster>-model): one address, one map, one policy per stack
    domain: str  # users call https://<domain>
    allowed_source_ranges: tuple[str, ...]  # CIDR ranges Cloud Armor lets in


class PublicEndpoint(pulumi.ComponentResource):
    address_name: str  # the Gateway's NamedAddress
    certificate_map_name: str  # the Gateway's networking.gke.io/certmap
    security_policy_name: str  # the backend policies' securityPolicy
    address: pulumi.Output[str]
    dns_records: pulumi.Output[list[dict]]  # what users publish: {name, type, data}
    ready: list[pulumi.Resource]  # what the Gateway and its policies wait for

    def __init__(self, name: str, args: PublicEndpointArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:PublicEndpoint", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.address_name = self.certificate_map_name = self.security_policy_name = args.name
        reserved = gcp.compute.GlobalAddress(f"{name}-address", project=args.project, name=args.name,
                                             opts=child)
        authorization = gcp.certificatemanager.DnsAuthorization(
            f"{name}-dns-authorization", project=args.project, name=args.name, domain=args.domain, opts=child)
        certificate = gcp.certificatemanager.Certificate(
            f"{name}-certificate", project=args.project, name=args.name, scope=CERTIFICATE_SCOPE,
            managed={"domains": [args.domain], "dns_authorizations": [authorization.id]}, opts=child)
        certificate_map = gcp.certificatemanager.CertificateMap(
            f"{name}-certificate-map", project=args.project, name=args.name, opts=child)
        entry = gcp.certificatemanager.CertificateMapEntry(
            f"{name}-certificate-map-entry", project=args.project, name=args.name, map=certificate_map.name,
            certificates=[certificate.id], hostname=args.domain, opts=child)
        allowlist = gcp.compute.SecurityPolicy(
            f"{name}-allowlist", project=args.project, name=args.name, type=SECURITY_POLICY_TYPE,
            description=f"who may call the model at {args.domain}",
            rules=allowlist_rules(args.allowed_source_ranges), opts=child)
        self.address = reserved.address
        self.dns_records = pulumi.Output.all(reserved.address, authorization.dns_resource_records).apply(
            lambda values: [{"name": f"{args.domain}.", "type": "A", "data": values[0]},
                            *[{"name": record["name"], "type": record["type"], "data": record["data"]}
                              for record in values[1] or []]])
        self.ready = [reserved, entry, allowlist]
        self.register_outputs({"address": self.address, "dnsRecords": self.dns_records})
