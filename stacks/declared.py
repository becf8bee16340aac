"""A resource as a stack declares it, and the Kubernetes manifest it stands for: the one conversion the
render (stacks/render.py, under Pulumi's mocks) and the policy pack (stacks/policy_pack.py, under
Pulumi's policy engine) share, so that the policies judge the same objects in both.

Both receive a resource's properties as a protobuf Struct: every number a float. The policy engine
(pulumi_policy 1.21.0, policy.py's AnalyzeStack) also wraps them in read-only proxies, Mappings and
Sequences that are not dicts and lists, which raise UnknownValueError on a value Pulumi computes only
during `pulumi up`. `plain` turns either into dicts and lists, whole numbers into ints and each
unknown value into UNKNOWN. Standard library only: the policy pack's virtualenv has no more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HEAD_KEYS = ("apiVersion", "kind", "metadata")


class Unknown:
    """A value Pulumi computes during `pulumi up`: a policy judges it then, once it is known."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown()


def plain(value: Any, unknown_error: type[Exception] | tuple[type[Exception], ...] = ()) -> Any:
    """`value` as plain data: Mappings as dicts, Sequences (not strings) as lists, integral floats as
    ints, and any item whose reading raises `unknown_error` as UNKNOWN."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: plain(_item(value, key, unknown_error), unknown_error) for key in value}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(_item(value, index, unknown_error), unknown_error) for index in range(len(value))]
    return value


def _item(container: Any, key: Any, unknown_error: type[Exception] | tuple[type[Exception], ...]) -> Any:
    try:
        return container[key]
    except unknown_error:
        return UNKNOWN


@dataclasses.dataclass(frozen=True)
class Declared:
    """A declared resource: its type token, name and inputs (plain data), and, where the reader knows
    them (the render does, the policy engine need not), how it is ordered among the others."""
    type: str
    name: str
    inputs: dict
    custom: bool = True
    # Names of the resources it waits for: named in depends_on, or whose outputs its inputs use.
    depends_on: frozenset[str] = frozenset()
    delete_before_replace: bool = False
    # Name of its parent (a component, or the stack): it registers, so it is created, after its parent.
    parent: str = ""
    # `pulumi destroy` leaves it in the cloud and forgets it (ResourceOptions.retain_on_delete).
    retained_on_delete: bool = False
    # The name of the resource whose deletion deletes it too (ResourceOptions.deleted_with): not
    # deleted on its own by `pulumi destroy`.
    deleted_with: str = ""

    @property
    def is_kubernetes_object(self) -> bool:
        """A Kubernetes object the provider applies: not a provider, a chart or a kustomization."""
        return (self.custom and self.type.startswith("kubernetes:")
                and "kind" in self.inputs and "apiVersion" in self.inputs)


def kubernetes_object(resource: Declared) -> dict:
    """The manifest the Kubernetes provider applies for `resource`: the name defaults to the resource's
    (Pulumi autonames it with a random suffix; the render and the policies use the plain name)."""
    inputs = resource.inputs
    metadata = {"name": resource.name, **(inputs.get("metadata") or {})}
    head = {"apiVersion": inputs["apiVersion"], "kind": inputs["kind"], "metadata": metadata}
    return {**head, **{key: value for key, value in inputs.items() if key not in HEAD_KEYS}}


def kubernetes_objects(resources: Iterable[Declared]) -> list[dict]:
    return [kubernetes_object(resource) for resource in resources if resource.is_kubernetes_object]
