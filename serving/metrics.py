"""Prometheus metrics of the server, on KServe's own /metrics endpoint (the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

REQUESTS = Counter("dist_ml_requests_total", "Inference requests", ["protocol", "status"])
LATENCY = Histogram("dist_ml_request_seconds", "Inference request latency", ["protocol", "status"],
                    buckets=LATENCY_BUCKETS)
ERRORS = Counter("dist_ml_errors_total", "Failed inference requests", ["kind"])
BATCH_SIZE = Histogram("dist_ml_batch_size", "Instances per model call", buckets=BATCH_BUCKETS)
MODEL_VERSION = Gauge("dist_ml_model_version", "Model version being served", ["model"])
QUEUE_FULL = Counter("dist_ml_queue_full_total",
                     "Inference requests refused with 503: the batcher's queue was full")
LOG_ENTRIES_DROPPED = Counter("dist_ml_log_entries_dropped_total",
                              "Request log entries dropped: queue full or sink failing")

ERROR_KINDS = {400: "invalid_input", 404: "not_found", 413: "body_too_large", 422: "invalid_request",
               503: "not_ready"}


def error_kind(status: int) -> str | None:
    if status < 400:
        return None
    return ERROR_KINDS.get(status, "internal" if status >= 500 else "client_error")
