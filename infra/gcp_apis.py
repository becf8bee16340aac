"""The Google APIs the GKE stack's resources need, enabled as code. A fresh project has none of them
on, and a resource whose API is off fails on creation: every other Google resource of the stack
depends on this component, so none is created before the APIs are on."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_gcp as gcp

# API -> what of the stack needs it. Service Usage (serviceusage.googleapis.com), the API that
# enables these, is on in every new project and cannot be enabled through itself.
GCP_APIS: dict[str, str] = {
    "compute.googleapis.com": "the cluster's VPC network and node VMs, the Gateway's load balancer, its "
                              "public address and Cloud Armor allowlist",
    "certificatemanager.googleapis.com": "a public endpoint's Google-managed certificate and its map",
    "container.googleapis.com": "the GKE cluster and its node pools",
    "sqladmin.googleapis.com": "the tracking server's Cloud SQL instance, its database and IAM user; the "
                               "Cloud SQL Auth Proxy's connections",
    "servicenetworking.googleapis.com": "private services access: the Cloud SQL instance's private address "
                                        "in the stack's network",
    "artifactregistry.googleapis.com": "the image repository and its reader grant; image pushes and pulls",
    "iam.googleapis.com": "the Google service accounts and the Workload Identity bindings on them",
    "iamcredentials.googleapis.com": "Workload Identity: GKE's metadata server mints the pods' Google tokens",
    "storage.googleapis.com": "the bucket and its grant; the pods' GCS FUSE mounts",
    "cloudresourcemanager.googleapis.com": "project IAM bindings (the nodes' role on the project)",
    "logging.googleapis.com": "the cluster's system logs, which GKE sends to Cloud Logging by default",
    "monitoring.googleapis.com":
        "the cluster's system metrics, which GKE sends to Cloud Monitoring by default",
}


@dataclasses.dataclass(frozen=True)
class GcpApisArgs:
    project: str


class GcpApis(pulumi.ComponentResource):
    """One `projects.Service` per API of GCP_APIS. Destroying the stack leaves every API on, and so
    never turns off the services that depend on one: other things in the project may use them."""

    services: list[gcp.projects.Service]

    def __init__(self, name: str, args: GcpApisArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("dist-ml:infra:GcpApis", name, None, opts)
        self.services = [
            gcp.projects.Service(f"{name}-{api.partition('.')[0]}", project=args.project, service=api,
                                 disable_on_destroy=False, disable_dependent_services=False,
                                 opts=pulumi.ResourceOptions(parent=self))
            for api in GCP_APIS
        ]
        self.register_outputs({"services": [service.service for service in self.services]})
