"""Run a stack's program under Pulumi mocks and write what it declares, for review and for tests.

    python -m stacks.render --stack local|gke --out DIR [-c gcp:project=acme-ml-prod ...]

Reads Pulumi.<stack>.yaml as the Pulumi engine would and writes every Kubernetes object as YAML,
one file per object, plus summary.txt: the other resources (charts and kustomize installs with their
versions, commands, providers) and the stack outputs (secret ones masked). No cluster is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import pulumi
import yaml
from pulumi.runtime.mocks import MockMonitor

from common import cli
from pipeline.validation import ConfigError
from stacks.compose import define_stack
from stacks.config import from_pulumi_values, parse_stack_config
from stacks.declared import Declared, kubernetes_objects, plain
from stacks.settings import PROJECT

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_KUBECONFIG = "apiVersion: v1\nkind: Config\n# rendered under Pulumi mocks\n"
FAKE_DIGEST = "0" * 64
IMAGE_BUILD = "docker-build:index:Image"
# Remote components: Pulumi expands these on a real cluster; under mocks only their inputs show.
GCP_KEY_SETTINGS = (
    "name", "project", "location", "releaseChannel", "workloadIdentityConfig", "removeDefaultNodePool",
    "deletionProtection", "addonsConfig", "cluster", "autoscaling", "nodeConfig", "repositoryId", "format",
    "uniformBucketLevelAccess", "publicAccessPrevention", "versioning", "lifecycleRules", "accountId",
    "bucket", "role", "member", "serviceAccountId", "networkingMode", "ipAllocationPolicy", "network",
    "subnetwork", "ipCidrRange", "secondaryIpRanges", "purpose", "region", "domain", "managed", "hostname",
    "rules", "type",
)
REMOTE_COMPONENTS = ("kubernetes:helm.sh/v4:Chart", "kubernetes:kustomize/v2:Directory",
                     "kubernetes:yaml/v2:ConfigFile")


@dataclasses.dataclass(frozen=True)
class Rendered:
    resources: list[Declared]
    outputs: dict[str, Any]
    secret_outputs: set[str]

    @property
    def objects(self) -> list[dict]:
        return kubernetes_objects(self.resources)

    def of_type(self, type_token: str) -> list[Declared]:
        return [r for r in self.resources if r.type == type_token]


class RecordingMocks(pulumi.runtime.Mocks):
    """Records each declared resource; answers as a provider would for what the program reads back."""

    def __init__(self) -> None:
        self.declared: list[Declared] = []
        self.dependencies: dict[tuple[str, str], frozenset[str]] = {}  # (type, name) -> names
        self.parents: dict[tuple[str, str], str] = {}  # (type, name) -> the parent's name
        self.deleted_before_replaced: set[tuple[str, str]] = set()
        self.retained_on_delete: set[tuple[str, str]] = set()
        self.deleted_with: dict[tuple[str, str], str] = {}  # (type, name) -> the resource it goes with

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        key = (args.typ, args.name)
        self.declared.append(Declared(args.typ, args.name, plain(args.inputs), bool(args.custom),
                                      self.dependencies.get(key, frozenset()),
                                      key in self.deleted_before_replaced, self.parents.get(key, ""),
                                      key in self.retained_on_delete, self.deleted_with.get(key, "")))
        state = dict(args.inputs)
        if args.typ == "command:local:Command":
            state["stdout"] = command_output(args.inputs)
        elif args.typ == "gcp:serviceaccount/account:Account":
            email = f"{args.inputs['accountId']}@{args.inputs.get('project')}.iam.gserviceaccount.com"
            state.update(email=email, name=f"projects/{args.inputs.get('project')}/serviceAccounts/{email}")
        elif args.typ == "gcp:container/cluster:Cluster":
            endpoints = args.inputs.get("controlPlaneEndpointsConfig") or {}
            dns = {**endpoints.get("dnsEndpointConfig", {}),
                   "endpoint": "gke-0a1b2c3d4e5f-4821.us-central1.gke.goog"}
            state.update(endpoint="10.0.0.2", masterAuth={"clusterCaCertificate": "RkFLRS1DQQ=="},
                         controlPlaneEndpointsConfig={**endpoints, "dnsEndpointConfig": dns})
        elif args.typ == "gcp:compute/globalAddress:GlobalAddress":
            state["address"] = "203.0.113.20"
        elif args.typ == "gcp:certificatemanager/dnsAuthorization:DnsAuthorization":
            state["dnsResourceRecords"] = [{
                "name": f"_acme-challenge.{args.inputs['domain']}.", "type": "CNAME",
                "data": "0a1b2c.3.authorize.certificatemanager.goog."}]
        elif args.typ == "gcp:storage/bucket:Bucket":
            state["url"] = f"gs://{args.inputs.get('name')}"
        elif args.typ == IMAGE_BUILD:
            digest = f"sha256:{FAKE_DIGEST}"
            state.update(digest=digest, ref=f"{args.inputs['tags'][0]}@{digest}")
        if args.typ.startswith("kubernetes:") and "metadata" in state:
            # As the provider autonames: the resource's name when the manifest gives none.
            state["metadata"] = {"name": args.name, **state["metadata"]}
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"accessToken": "fake-access-token", "project": "", "region": "", "zone": "", "id": ""}
        return {}


class RecordingMonitor(MockMonitor):
    """The mocks' engine, noting what each registered resource depends on and its parent (which the
    mocks' own arguments leave out) for RecordingMocks."""

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        self.recording = mocks

    def RegisterResource(self, request):  # noqa: N802 - the engine's RPC name
        self.recording.dependencies[(request.type, request.name)] = frozenset(
            urn.rpartition("::")[2] for urn in request.dependencies)
        self.recording.parents[(request.type, request.name)] = request.parent.rpartition("::")[2]
        if request.deleteBeforeReplace:
            self.recording.deleted_before_replaced.add((request.type, request.name))
        if request.retainOnDelete:
            self.recording.retained_on_delete.add((request.type, request.name))
        if request.deletedWith:
            key = (request.type, request.name)
            self.recording.deleted_with[key] = request.deletedWith.rpartition("::")[2]
        return super().RegisterResource(request)


def command_output(inputs: dict) -> str:
    """What a command prints: a kubeconfig (k3d kubeconfig get), or nothing."""
    return FAKE_KUBECONFIG if "kubeconfig" in str(inputs.get("create")) else ""


def pulumi_values(stack_file: Path) -> dict[str, str]:
    """Pulumi.<stack>.yaml's config as the engine passes it: structured values as JSON text."""
    document = yaml.safe_load(stack_file.read_text()) or {}
    values = {}
    for key, value in (document.get("config") or {}).items():
        values[key] = value if isinstance(value, str) else json.dumps(value)
    return values


def stack_values(stack_file: Path, **sections: dict) -> dict[str, str]:
    """The stack file's values with some sections' keys changed, as a user edits it (`pipeline=...`,
    `cluster=...`; None removes a key)."""
    values = pulumi_values(stack_file)
    for section, changes in sections.items():
        key = f"dist-ml:{section}"
        merged = {**json.loads(values.get(key, "{}")), **changes}
        values[key] = json.dumps({k: v for k, v in merged.items() if v is not None})
    return values


def install_mocks(stack: str, values: Mapping[str, str]) -> RecordingMocks:
    """Points the Pulumi runtime at fresh recording mocks with the stack's config `values`."""
    # The runtime schedules its calls on the current event loop; asyncio.run() elsewhere in the
    # process may have left none.
    asyncio.set_event_loop(asyncio.new_event_loop())
    # A root stack of this run's own: one a program that stopped early (a config error) left behind
    # holds futures of the loop it ran on.
    pulumi.runtime.reset_options(project=PROJECT, stack=stack)
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False,
                             monitor=RecordingMonitor(mocks))
    pulumi.runtime.set_all_config(dict(values))
    return mocks


def render(stack: str, values: Mapping[str, str]) -> Rendered:
    """Runs the program under mocks with config `values`; raises ConfigError on bad config."""
    config = parse_stack_config(from_pulumi_values(values))
    mocks = install_mocks(stack, values)
    outputs: dict[str, Any] = {}
    secrets: set[str] = set()

    @pulumi.runtime.test
    def program():
        declared = define_stack(config)

        async def collect() -> None:
            for name, value in declared.items():
                output = pulumi.Output.from_input(value)
                outputs[name] = await output.future()
                if await output.is_secret():
                    secrets.add(name)

        return pulumi.Output.from_input(collect())

    program()
    return Rendered(mocks.declared, outputs, secrets)


def file_name(manifest: dict) -> str:
    metadata = manifest["metadata"]
    parts = [manifest["kind"], metadata.get("namespace", ""), metadata["name"]]
    return "-".join(part for part in parts if part).lower() + ".yaml"


def summary(rendered: Rendered) -> str:
    lines = ["# Resources other than Kubernetes objects", ""]
    for resource in rendered.resources:
        if resource.is_kubernetes_object:
            continue
        if resource.type in REMOTE_COMPONENTS:
            keys = ("chart", "version", "namespace", "values", "directory", "file")
            detail = {key: resource.inputs[key] for key in keys if resource.inputs.get(key)}
        elif resource.type == "command:local:Command":
            detail = {key: resource.inputs[key] for key in ("create", "delete") if resource.inputs.get(key)}
        elif resource.type == IMAGE_BUILD:
            detail = {key: resource.inputs[key] for key in ("dockerfile", "tags", "platforms", "push", "load")
                      if key in resource.inputs}
        elif resource.type.startswith("gcp:"):
            detail = {key: value for key, value in resource.inputs.items() if key in GCP_KEY_SETTINGS}
        elif resource.type.startswith("pulumi:providers:"):
            detail = {key: value for key, value in resource.inputs.items() if key in ("namespace",)}
        else:
            continue  # our own components: their children are listed
        lines.append(f"{resource.type}  {resource.name}  {json.dumps(detail, sort_keys=True)}")
    lines += ["", "# Stack outputs", ""]
    for name, value in sorted(rendered.outputs.items()):
        lines.append(f"{name}: {'[secret]' if name in rendered.secret_outputs else value}")
    return "\n".join(lines) + "\n"


def write(rendered: Rendered, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for manifest in rendered.objects:
        path = out / file_name(manifest)
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        paths.append(path)
    (out / "summary.txt").write_text(summary(rendered))
    return [*paths, out / "summary.txt"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog="stacks.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", required=True, help="reads Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("-c", "--config", type=config_setting, action="append", default=[],
                        metavar="KEY=VALUE", help="set or override one config value, as `pulumi up -c` "
                        "does (a key without a namespace is the project's)")
    return parser.parse_args(argv)


def config_setting(text: str) -> tuple[str, str]:
    """`pulumi up -c`'s form: KEY=VALUE, the key namespaced with the project unless it has one."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key = key.strip()
    return (key if ":" in key else f"{PROJECT}:{key}"), value


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    stack_file = REPO_ROOT / f"Pulumi.{args.stack}.yaml"
    if not stack_file.is_file():
        raise cli.UsageError(f"{stack_file}: no such stack file")
    try:
        rendered = render(args.stack, {**pulumi_values(stack_file), **dict(args.config)})
    except ConfigError as error:
        raise cli.UsageError(f"{stack_file.name}: {error}") from None
    paths = write(rendered, args.out)
    print(f"stacks.render: {len(paths) - 1} Kubernetes objects and summary.txt in {args.out}")


if __name__ == "__main__":
    cli.run("stacks.render", main)
