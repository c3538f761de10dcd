"""Prometheus metrics of the service, on a registry of its own (one per app).

| metric                                       | type      | labels                 |
|----------------------------------------------|-----------|------------------------|
| ``contextmode_turns_total``                  | counter   | ``mode``, ``outcome`` (ok, partial, error, client_gone) |
| ``contextmode_layer_tokens``                 | histogram | ``layer`` (tokens used per turn) |
| ``contextmode_context_tokens``               | histogram | (total input tokens per turn) |
| ``contextmode_model_latency_seconds``        | histogram | (whole answer stream)  |
| ``contextmode_ttft_seconds``                 | histogram | (turn start → first token) |
| ``contextmode_jobs_scheduled_total``         | counter   | ``job``                |
| ``contextmode_job_failures_total``           | counter   | ``job`` (failed attempts, retries included) |
| ``contextmode_active_streams``               | gauge     |                        |
| ``contextmode_http_requests_total``          | counter   | ``method``, ``route``, ``status`` |
| ``contextmode_http_request_seconds``         | histogram | ``method``, ``route``  |
| ``contextmode_erased_records_total``         | counter   | ``source`` (forget, retention, sync), ``kind`` |
| ``contextmode_retention_runs_total``         | counter   | ``outcome`` (ok, error) |
| ``contextmode_retention_last_run_timestamp_seconds`` | gauge | (Unix time of the last finished run) |
"""

from __future__ import annotations

from collections.abc import Mapping

from ..engine import TurnResult
from ..errors import MissingExtra

__all__ = ["ServiceMetrics"]

_TOKEN_BUCKETS = (0, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072)
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServiceMetrics:
    """The service's metrics and their text exposition; also the job runner's `JobHooks`."""

    def __init__(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:
            raise MissingExtra("service", "prometheus_client") from exc
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = Counter("contextmode_turns", "Chat turns served", ["mode", "outcome"], registry=r)
        self.layer_tokens = Histogram(
            "contextmode_layer_tokens", "Tokens used per layer per turn", ["layer"], buckets=_TOKEN_BUCKETS, registry=r
        )
        self.context_tokens = Histogram(
            "contextmode_context_tokens", "Input tokens per turn", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.model_latency = Histogram(
            "contextmode_model_latency_seconds", "Time streaming the model's answer", buckets=_SECONDS_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "contextmode_ttft_seconds", "Time from the start of a turn to its first token", buckets=_SECONDS_BUCKETS, registry=r
        )
        self.jobs_scheduled = Counter("contextmode_jobs_scheduled", "Background jobs scheduled", ["job"], registry=r)
        self.job_failures = Counter("contextmode_job_failures", "Failed background job attempts", ["job"], registry=r)
        self.active_streams = Gauge("contextmode_active_streams", "SSE streams open now", registry=r)
        self.http_requests = Counter(
            "contextmode_http_requests", "HTTP requests", ["method", "route", "status"], registry=r
        )
        self.http_seconds = Histogram(
            "contextmode_http_request_seconds", "HTTP request duration", ["method", "route"], buckets=_SECONDS_BUCKETS, registry=r
        )

        self.erased = Counter(
            "contextmode_erased_records", "Records erased by forgets, retention and cache sync",
            ["source", "kind"], registry=r,
        )
        self.retention_runs = Counter("contextmode_retention_runs", "Retention job runs", ["outcome"], registry=r)
        self.retention_last_run = Gauge(
            "contextmode_retention_last_run_timestamp_seconds", "When the last retention run finished", registry=r
        )

    def count_erased(self, source: str, counts: Mapping[str, int]) -> None:
        """Add a forget's, retention run's or cache sync's counts per kind."""
        for kind, count in counts.items():
            if count:
                self.erased.labels(source=source, kind=kind).inc(count)

    def observe_turn(self, result: TurnResult, *, outcome: str) -> None:
        """Count a finished turn and its token accounting."""
        context = result.prepared.context
        self.turns.labels(mode=result.prepared.mode, outcome=outcome).inc()
        for name, account in context.accounts.items():
            self.layer_tokens.labels(layer=name).observe(account.used)
        self.context_tokens.observe(context.total_tokens)
        self.model_latency.observe(result.model_ms / 1000)
        if result.ttft_ms is not None:
            self.ttft.observe(result.ttft_ms / 1000)

    def count_turn(self, mode: str, outcome: str) -> None:
        """Count a turn that ended without a result (model error, client gone)."""
        self.turns.labels(mode=mode, outcome=outcome).inc()

    def job_scheduled(self, job: str) -> None:
        """`JobHooks`: a background job was scheduled."""
        self.jobs_scheduled.labels(job=job).inc()

    def job_failed(self, job: str) -> None:
        """`JobHooks`: an attempt of a background job failed (retries included)."""
        self.job_failures.labels(job=job).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
