"""The names of the server's Prometheus metrics that others read back, with the standard library
alone: the canary decision (serving.canary) from /metrics, and the autoscaler's queries
(common.cluster_names), which the Pulumi program renders without prometheus_client."""

from __future__ import annotations

# `version` is the served version that answered (the x-model-version header); "" for a request refused
# before one was chosen (a body too large, a full queue, an unparseable request).
REQUESTS_METRIC = "dist_ml_requests"
LATENCY_METRIC = "dist_ml_request_seconds"
ERRORS_METRIC = "dist_ml_errors"
VERSION_LABEL = "version"
# Inference requests the server has received and not yet answered, every protocol: what the
# predictor scales on by default (docs/concepts/serving.md).
IN_FLIGHT_METRIC = "dist_ml_requests_in_flight"
