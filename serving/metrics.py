"""Prometheus metrics of the server, on KServe's own /metrics endpoint (the default registry)."""

from __future__ import annotations

import functools
from contextvars import ContextVar

from prometheus_client import Counter, Gauge, Histogram

from common.metric_names import (
    ERRORS_METRIC,
    IN_FLIGHT_METRIC,
    LATENCY_METRIC,
    REQUESTS_METRIC,
    VERSION_LABEL,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

REQUESTS = Counter(REQUESTS_METRIC, "Inference requests", ["protocol", "status", VERSION_LABEL])
LATENCY = Histogram(LATENCY_METRIC, "Inference request latency", ["protocol", "status", VERSION_LABEL],
                    buckets=LATENCY_BUCKETS)
ERRORS = Counter(ERRORS_METRIC, "Failed inference requests", ["kind", VERSION_LABEL])
IN_FLIGHT = Gauge(IN_FLIGHT_METRIC, "Inference requests received and not yet answered, every protocol")
BATCH_SIZE = Histogram("dist_ml_batch_size", "Instances per model call", buckets=BATCH_BUCKETS)
MODEL_VERSION = Gauge("dist_ml_model_version", "Model version being served", ["model"])
QUEUE_FULL = Counter("dist_ml_queue_full_total",
                     "Inference requests refused with 503: the batcher's queue was full")
LOG_ENTRIES_DROPPED = Counter("dist_ml_log_entries_dropped_total",
                              "Request log entries dropped: queue full or sink failing")

# The version that handled the request in progress, for a failure, whose response carries no version
# header: the server's middleware sets a fresh holder per request, the model fills it in. A holder,
# not the value, so that the model's writes reach the middleware through any copy of the context.
ANSWERED_BY: ContextVar[dict[str, str] | None] = ContextVar("answered_by", default=None)

ERROR_KINDS = {400: "invalid_input", 404: "not_found", 413: "body_too_large", 422: "invalid_request",
               503: "not_ready"}


@functools.cache
def request_series(protocol: str, status: int, version: str) -> tuple[Counter, Histogram]:
    """The request counter's and the latency histogram's series for one label set, looked up once:
    prometheus_client's labels() takes a lock and checks its arguments on every call."""
    return (REQUESTS.labels(protocol, str(status), version),
            LATENCY.labels(protocol, str(status), version))


def observe_request(protocol: str, status: int, version: str, seconds: float) -> None:
    """One answered request: counted, and its latency observed."""
    requests, latency = request_series(protocol, status, version)
    requests.inc()
    latency.observe(seconds)


def error_kind(status: int) -> str | None:
    if status < 400:
        return None
    return ERROR_KINDS.get(status, "internal" if status >= 500 else "client_error")


def note_answered_by(version: int | None) -> None:
    """Labels the request in progress with `version` (nothing for None or outside a measured request)."""
    holder = ANSWERED_BY.get()
    if holder is not None and version is not None:
        holder[VERSION_LABEL] = str(version)
