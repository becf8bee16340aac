"""The canary decision, the same on both engines: promote the canary or roll it back, on the evidence
of the server's own metrics (`/metrics`, requests, latency and errors labelled by the `version` that
answered).

Errors are every request the server answered with a 4xx or 5xx (serving.metrics.ERRORS). Client
mistakes land on both versions in proportion to the split, so they cancel out in the comparison,
while a canary that refuses inputs the stable version accepts (another input signature, say) is
caught. The counters are cumulative since the server started: `Evidence.since` gives what happened
during the canary.

The decision, in order:
- fewer than `min_requests` canary requests: ROLL BACK. The wait was bounded (`rollout.maxWait`)
  and a version that could not be shown to be safe is not given all the traffic; the version stays
  on disk, and `python -m pipeline promote` takes it anyway once a person has looked.
- canary error rate above the stable's plus `max_error_rate_increase`: roll back.
- canary mean latency above `max_latency_ratio` times the stable's: roll back. With no stable
  request to compare with (a stable version that got no traffic), latency cannot be judged and is
  not held against the canary: the reason says so.
- otherwise: promote.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from serving.metrics import ERRORS_METRIC, LATENCY_METRIC, REQUESTS_METRIC, VERSION_LABEL


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What one version answered: requests, those that failed, and their latencies' sum."""
    requests: int = 0
    errors: int = 0
    latency_seconds_sum: float = 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def mean_latency_seconds(self) -> float:
        return self.latency_seconds_sum / self.requests if self.requests else 0.0

    def since(self, earlier: Evidence) -> Evidence:
        """What happened after `earlier` was read (the counters only grow while the server runs)."""
        return Evidence(self.requests - earlier.requests, self.errors - earlier.errors,
                        self.latency_seconds_sum - earlier.latency_seconds_sum)

    def as_record(self) -> dict:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 6),
                "mean_latency_ms": round(self.mean_latency_seconds * 1000, 3)}


def evidence_by_version(prometheus_text: str) -> dict[str, Evidence]:
    """Evidence per served version (its number as a string; "" for requests refused before any
    version was chosen) from the server's /metrics text. Versions never seen are absent."""
    requests: dict[str, float] = defaultdict(float)
    errors: dict[str, float] = defaultdict(float)
    latency: dict[str, float] = defaultdict(float)
    wanted = {f"{REQUESTS_METRIC}_total": requests, f"{ERRORS_METRIC}_total": errors,
              f"{LATENCY_METRIC}_sum": latency}
    for family in text_string_to_metric_families(prometheus_text):
        for sample in family.samples:
            totals = wanted.get(sample.name)
            if totals is not None and VERSION_LABEL in sample.labels:
                totals[sample.labels[VERSION_LABEL]] += sample.value
    return {version: Evidence(int(requests[version]), int(errors.get(version, 0)),
                              latency.get(version, 0.0))
            for version in sorted(requests)}


@dataclasses.dataclass(frozen=True)
class Policy:
    min_requests: int
    max_error_rate_increase: float
    max_latency_ratio: float


@dataclasses.dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    stable: Evidence
    canary: Evidence

    def as_record(self) -> dict:
        return {"decision": "promote" if self.promote else "rollback", "reason": self.reason,
                "stable": self.stable.as_record(), "canary": self.canary.as_record()}


def decide(stable: Evidence, canary: Evidence, policy: Policy) -> Decision:
    """Promote or roll back the canary (the module's docstring gives the rules and their order)."""
    def verdict(promote: bool, reason: str) -> Decision:
        return Decision(promote, reason, stable, canary)

    if canary.requests < policy.min_requests:
        return verdict(False, f"the canary answered {canary.requests} requests, fewer than the "
                              f"{policy.min_requests} required")
    increase = canary.error_rate - stable.error_rate
    if increase > policy.max_error_rate_increase:
        return verdict(False, f"the canary's error rate {canary.error_rate:.2%} exceeds the stable's "
                              f"{stable.error_rate:.2%} by more than {policy.max_error_rate_increase:.2%}")
    if stable.requests == 0:
        return verdict(True, f"the canary answered {canary.requests} requests with error rate "
                             f"{canary.error_rate:.2%}; the stable version got none, so latency "
                             f"was not compared")
    ratio = canary.mean_latency_seconds / stable.mean_latency_seconds \
        if stable.mean_latency_seconds else 1.0
    if ratio > policy.max_latency_ratio:
        return verdict(False, f"the canary's mean latency {canary.mean_latency_seconds * 1000:.1f} ms is "
                              f"{ratio:.2f}x the stable's {stable.mean_latency_seconds * 1000:.1f} ms, "
                              f"over {policy.max_latency_ratio:g}x")
    return verdict(True, f"the canary's error rate {canary.error_rate:.2%} (stable "
                         f"{stable.error_rate:.2%}) and mean latency {ratio:.2f}x the stable's are "
                         f"within bounds over {canary.requests} requests")
