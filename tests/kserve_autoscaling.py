"""KServe v0.20.0 on a predictor's scaling, restated from its code for the tests (tag v0.20.0, commit
1fb781055dd1567164358233e1125142ca6ef1fe; paths under kserve/kserve):

- `webhook_error(isvc)`: what the InferenceService webhook says of its scaling fields, the first error
  or None, as pkg/apis/serving/v1beta1/inference_service_validation.go validateInferenceService runs
  them (lines 119-181): the autoscaler class (validateInferenceServiceAutoscaler, 477-491), then per
  component the replicas (component.go validateReplicas, 374-388) and the class's rules
  (validateAutoScalingCompExtension, 446-466: hpa 527-565, keda 567-634, validateScaleTarget 508-525).
- `scaled_object(isvc, namespace)`: the KEDA ScaledObject KServe's controller writes for a keda-class
  predictor (pkg/controller/v1beta1/inferenceservice/reconcilers/keda/keda_reconciler.go
  createKedaScaledObject 187-278, getKedaMetrics 81-185), with the chart's `autoscaler` config
  (charts/kserve-resources/values.yaml 105-107) as the fallback stabilization windows.

Only what our InferenceServices can carry is restated: the predictor (no transformer or explainer),
Standard mode, External and Resource metrics (not PodMetric, which needs OpenTelemetry).
"""

from __future__ import annotations

import re

STANDARD = "Standard"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
AUTOSCALER_CLASS = "serving.kserve.io/autoscalerClass"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
ALLOWED_CLASSES = ("hpa", "external", "keda", "none")  # pkg/constants/constants.go 277-282
HPA_METRICS = ("cpu", "memory")  # constants.go 285-288
DEFAULT_MIN_REPLICAS = 1  # constants.go DefaultMinReplicas
DEFAULT_CPU_UTILIZATION = 80  # constants.go 298
# charts/kserve-resources/values.yaml 105-107, the ConfigMap key `autoscaler` (configmap-patch.yaml).
CHART_AUTOSCALER_CONFIG = {"scaleUpStabilizationWindowSeconds": "0",
                           "scaleDownStabilizationWindowSeconds": "300"}
MEBIBYTE = 2**20
QUANTITY_UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 1e-3}


def quantity(value: int | float | str) -> float:
    found = re.fullmatch(r"([0-9.]+)(m|k|M|G|Ki|Mi|Gi)?", str(value))
    return float(found[1]) * QUANTITY_UNITS[found[2] or ""]


def validate_scale_target(target: dict) -> str | None:
    """validateScaleTarget, 508-525 (validateTargetUtilization, 501-506)."""
    kind = target.get("type")
    if kind == "Utilization":
        if target.get("averageUtilization") is None:
            return "the AverageUtilization type should be set"
        if not 1 <= target["averageUtilization"] <= 100:
            return "the target utilization percentage should be a [1-100] integer"
    if kind == "AverageValue" and target.get("averageValue") is None:
        return "the AverageValue type should be set"
    if kind == "Value" and target.get("value") is None:
        return "the Value type should be set"
    return None


def hpa_error(component: dict) -> str | None:
    """validateScalingHPACompExtension, 527-565."""
    metric = component.get("scaleMetric", "cpu")
    if metric not in HPA_METRICS:
        return f"[{metric}] is not a supported metric"
    target = component.get("scaleTarget")
    if target is not None:
        # Go's precedence, as written: `metric == MetricCPU && target < 1 || target > 100`.
        if (metric == "cpu" and target < 1) or target > 100:
            return "the target utilization percentage should be a [1-100] integer"
        if metric == "memory" and target < 1:
            return "the target memory should be greater than 1 MiB"
    for spec in (component.get("autoScaling") or {}).get("metrics", []):
        if spec.get("type") != "Resource":
            return (f"invalid HPA metric source type with value [{spec.get('type')}],"
                    "valid metric source types are Resource")
        if spec.get("resource") is None:
            return "metricSpec.Resource is not set for resource metric source type"
    return None


def keda_error(component: dict) -> str | None:
    """validateScalingKedaCompExtension, 567-634."""
    if component.get("scaleMetric") is not None:
        return "ScaleMetric is not supported for KEDA"
    for spec in (component.get("autoScaling") or {}).get("metrics", []):
        kind = spec.get("type")
        if kind == "Resource":
            resource = spec.get("resource")
            if resource is None:
                return "metricSpec.Resource is not set for resource metric source type"
            target = resource.get("target", {})
            if resource.get("name") == "cpu" and target.get("type") != "Utilization":
                return "the cpu target value type should be Utilization"
            if resource.get("name") == "memory":
                if target.get("type") not in ("AverageValue", "Utilization"):
                    return "the memory target value type should be AverageValue or Utilization"
                if target.get("type") == "AverageValue" and quantity(target["averageValue"]) < MEBIBYTE:
                    return "the memory target value should be greater than 1 MiB"
            if resource.get("name") not in HPA_METRICS:
                return f"resource type {resource.get('name')} is not supported"
            found = validate_scale_target(target)
        elif kind == "External":
            external = spec.get("external")
            if external is None:
                return "metricSpec.External is not set for external metric source type"
            if not external.get("metric", {}).get("query"):
                return "the query should not be empty"
            if external.get("target", {}).get("value") is None:
                return "the target threshold value should not be empty"
            found = validate_scale_target(external["target"])
        else:
            return f"unknown KEDA metric type with value [{kind}].Valid types are Resource,External,PodMetric"
        if found:
            return found
    return None


def replicas_error(component: dict) -> str | None:
    """validateReplicas, component.go 374-388 (its messages: component.go 36-38)."""
    low, high = component.get("minReplicas", DEFAULT_MIN_REPLICAS), component.get("maxReplicas", 0)
    if low < 0:
        return "'MinReplicas' cannot be less than 0"
    if high < 0:
        return "'MaxReplicas' cannot be less than 0"
    if low > high and high != 0:
        return "'MinReplicas' cannot be greater than MaxReplicas"
    return None


def webhook_error(isvc: dict) -> str | None:
    """The first error KServe's webhook finds in the predictor's scaling, or None."""
    annotations = isvc["metadata"].get("annotations", {})
    if AUTOSCALER_CLASS in annotations and annotations[AUTOSCALER_CLASS] not in ALLOWED_CLASSES:
        return f"[{annotations[AUTOSCALER_CLASS]}] is not a supported autoscaler class type"
    predictor = isvc["spec"]["predictor"]
    if found := replicas_error(predictor):
        return found
    if annotations.get(DEPLOYMENT_MODE) != STANDARD:
        raise NotImplementedError("only Standard mode is restated (the stacks install no Knative)")
    rules = {"hpa": hpa_error, "keda": keda_error}.get(annotations.get(AUTOSCALER_CLASS))
    return rules(predictor) if rules else None  # other classes: no checks (446-466)


def keda_triggers(predictor: dict) -> list[dict]:
    """getKedaMetrics, 81-185: External and Resource metrics."""
    triggers = []
    for spec in (predictor.get("autoScaling") or {}).get("metrics", []):
        if spec["type"] == "External":
            external = spec["external"]
            metadata = {"serverAddress": external["metric"].get("serverAddress", ""),
                        "query": external["metric"]["query"],
                        # the target's original string (getOriginalStringMQ), "0" when absent
                        "threshold": str(external["target"].get("value", "0"))}
            if external["metric"].get("backend") == "prometheus" and external["metric"].get("namespace"):
                metadata["namespace"] = external["metric"]["namespace"]
            triggers.append({"type": external["metric"].get("backend", ""), "metadata": metadata})
        elif spec["type"] == "Resource":
            resource, value = spec["resource"], "0"
            target = resource["target"]
            if target["type"] == "Utilization":
                utilization = target.get("averageUtilization")
                if utilization is None and resource["name"] == "cpu":
                    utilization = DEFAULT_CPU_UTILIZATION
                value = str(utilization) if utilization is not None else "0"
            elif target["type"] in ("AverageValue", "Value"):
                value = str(target.get("averageValue" if target["type"] == "AverageValue" else "value", "0"))
            triggers.append({"type": resource["name"], "metadata": {"value": value},
                             "metricType": target["type"]})
    return triggers


def scaled_object(isvc: dict, namespace: str, autoscaler_config: dict = CHART_AUTOSCALER_CONFIG) -> dict:
    """createKedaScaledObject, 187-278, for the predictor of `isvc` in `namespace`."""
    predictor = isvc["spec"]["predictor"]
    assert "name" not in predictor  # else the name is <isvc>-<name>-predictor (constants.go 799-804)
    name = f"{isvc['metadata']['name']}-predictor"
    windows = {}
    behavior = (predictor.get("autoScaling") or {}).get("behavior") or {}
    for direction in ("scaleDown", "scaleUp"):
        window = (behavior.get(direction) or {}).get("stabilizationWindowSeconds")
        fallback = autoscaler_config.get(f"{direction}StabilizationWindowSeconds", "")
        if window is None and fallback.isdigit():
            window = int(fallback)
        if window is not None:
            windows[direction] = {"stabilizationWindowSeconds": window}
    low = predictor.get("minReplicas", DEFAULT_MIN_REPLICAS)
    spec = {"scaleTargetRef": {"name": name}, "triggers": keda_triggers(predictor),
            "minReplicaCount": low, "maxReplicaCount": max(predictor.get("maxReplicas", 0), low)}
    if windows:
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": windows}}
    # The component's meta (predictor.go 498-518): the InferenceService's labels and annotations with
    # KServe's own labels; owned by the InferenceService (SetControllerReferences, 343-345).
    labels = {**isvc["metadata"].get("labels", {}), ISVC_LABEL: isvc["metadata"]["name"],
              "component": "predictor"}
    owner = {"apiVersion": isvc["apiVersion"], "kind": isvc["kind"], "name": isvc["metadata"]["name"],
             "uid": "00000000-0000-0000-0000-000000000000", "controller": True, "blockOwnerDeletion": True}
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": dict(isvc["metadata"].get("annotations", {})),
                         "ownerReferences": [owner]},
            "spec": spec}
