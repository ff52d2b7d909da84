"""The one registry of every setting a user can write, in trigger metadata or the ConfigMap.

Why one table: the trigger parser, the ConfigMap validator, `check-config` and the docs' parameter
list all read it, so a key can never be accepted in one place and rejected (or documented
differently) in another. Each field knows how to parse itself from a trigger string (KEDA sends
every metadata value as a string) or from a YAML scalar, and every rejection names the key and
what is accepted.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from gpu_queue_scaler.settings.labelregex import LabelRegexError, label_regex


class FieldError(ValueError):
    """A rejected value: `path` names the key (e.g. `profiles.llama.maxReplicas`)."""

    def __init__(self, path: str, message: str) -> None:
        # An empty key (a YAML `"": x`) is shown quoted, so the message still names it.
        super().__init__(f"{path or repr(path)}: {message}")
        self.path = path
        self.message = message


class Scope(Enum):
    """Where a key may be written."""

    TRIGGER = "trigger"  # identity of a workload: only in trigger metadata
    TUNING = "tuning"  # trigger metadata, a ConfigMap profile, or ConfigMap defaults
    SERVER = "server"  # ConfigMap `server:` section only: process-wide
    KEDA = "keda"  # read by KEDA itself from trigger metadata; passed through to us and ignored


Parser = Callable[[object], Any]


@dataclass(frozen=True)
class Field:
    key: str
    scope: Scope
    parse: Parser  # raw (str from a trigger, scalar from YAML) -> typed value; raises ValueError
    default: Any
    accepted: str  # what is accepted, as printed in errors and the docs
    doc: str

    def value(self, raw: object, path: str | None = None) -> Any:
        try:
            return self.parse(raw)
        except FieldError:
            raise
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            shown = raw if not isinstance(raw, str) or len(raw) <= 80 else raw[:77] + "..."
            text = str(exc)  # may quote the input (a bad host, a regex): bounded like `shown`
            detail = f" ({text if len(text) <= 200 else text[:197] + '...'})" if text else ""
            raise FieldError(
                path or self.key, f"got {shown!r}; accepted: {self.accepted}{detail}"
            ) from None


# --- scalar parsers -------------------------------------------------------------------------------


def _text(raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise TypeError("")
    return str(raw).strip()


def _number(raw: object) -> float:
    if isinstance(raw, bool):
        raise TypeError("")
    if isinstance(raw, (int, float)):
        value = float(raw)
    else:
        text = _text(raw)
        if not text.isascii():  # float() accepts other scripts' digits; a setting should not
            raise ValueError("")
        value = float(text)
    if not math.isfinite(value):
        raise ValueError("")
    return value


@dataclass(frozen=True)
class Range:
    """A numeric parser that keeps its bounds inspectable (docs, tests, fuzzers)."""

    lo: float
    hi: float
    lo_open: bool = False
    integer: bool = False

    def __call__(self, raw: object) -> float | int:
        value = _number(raw)
        if value < self.lo or value > self.hi or (self.lo_open and value == self.lo):
            raise ValueError("")
        if self.integer:
            if value != int(value):
                raise ValueError("")
            return int(value)
        return value


def real(lo: float, hi: float, *, lo_open: bool = False) -> Range:
    return Range(lo, hi, lo_open=lo_open)


def integer(lo: int, hi: int) -> Range:
    return Range(lo, hi, integer=True)


def choice(*options: str) -> Parser:
    def parse(raw: object) -> str:
        value = _text(raw)
        if value not in options:
            raise ValueError("")
        return value

    return parse


AUTO = "auto"
DAILY_S = 86400.0
_SEASON_RANGE = Range(0, 7 * 86400)


def season_period(raw: object) -> str | float:
    """`auto`, or seconds within _SEASON_RANGE."""
    if isinstance(raw, str) and raw.strip() == AUTO:
        return AUTO
    return _SEASON_RANGE(raw)


def pattern(regex: str, max_len: int) -> Parser:
    compiled = re.compile(regex)

    def parse(raw: object) -> str:
        value = _text(raw)
        if not value or len(value) > max_len or not compiled.fullmatch(value):
            raise ValueError("")
        return value

    return parse


def http_url(raw: object) -> str:
    value = _text(raw)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError("")
    if parts.port == 0:  # parts.port raises ValueError on a non-numeric or out-of-range port
        raise ValueError("port 0")
    return value.rstrip("/")


def host_port(raw: str) -> tuple[str, int]:
    """Parse `host:port` or `[v6]:port` into a pair; hosts are DNS names or IP literals."""
    text = raw.strip()
    if not text.isascii():
        raise ValueError(f"non-ASCII characters in {text!r}")
    if ":" not in text:
        raise ValueError(f"missing :port in {text!r}")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        ipaddress.IPv6Address(host)
    else:
        host, sep, port = text.rpartition(":")
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", host):
            raise ValueError(f"bad host {host!r}")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"bad port in {text!r}")
    return host, int(port)


def host_ports(raw: object) -> tuple[tuple[str, int], ...]:
    items = [item for item in _text(raw).split(",") if item.strip()]
    if not items or len(items) > 1000:
        raise ValueError("")
    return tuple(host_port(item) for item in items)


LABEL_MATCHER = re.compile(
    r"\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"
    r'(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^,"\s]*))\s*(?:,|$)'
)


def label_matchers(raw: object) -> tuple[tuple[str, str, str], ...]:
    """Parse `a="x",b=~"y.*"` (quotes optional) into (label, op, value) triples."""
    text = _text(raw)
    matchers: list[tuple[str, str, str]] = []
    pos = 0
    while pos < len(text):
        found = LABEL_MATCHER.match(text, pos)
        if not found or found.end() == pos:
            raise ValueError(f"cannot read a matcher at {text[pos:][:30]!r}")
        value = found["quoted"] if found["quoted"] is not None else found["bare"]
        if found["quoted"] is not None:
            value = re.sub(r"\\(.)", r"\1", value)
        if found["op"] in ("=~", "!~"):
            try:
                label_regex(value)  # RE2, as the matching (and Prometheus) has it
            except LabelRegexError as exc:
                raise ValueError(f"bad regular expression {value[:80]!r}: {exc}") from None
        matchers.append((found["name"], found["op"], value))
        pos = found.end()
    if not matchers or len(matchers) > 20:
        raise ValueError("")
    return tuple(matchers)


def label_name_or_none(raw: object) -> str | None:
    value = _text(raw)
    if value == "none":
        return None
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("")
    return value


def promql(raw: object) -> str:
    """A PromQL expression; Prometheus itself is the real validator, so only basic shape here."""
    value = _text(raw)
    if not value or len(value) > 4000 or not value.isprintable():
        raise ValueError("")
    depth = 0
    for char in value:
        depth += {"(": 1, ")": -1, "{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            raise ValueError("unbalanced brackets")
    if depth:
        raise ValueError("unbalanced brackets")
    return value


# --- the registry ---------------------------------------------------------------------------------

NAME_RE = r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?"

BACKENDS = ("vllm", "triton", "custom", "synthetic")
SYNTHETIC_PATTERNS = ("wave", "sine", "constant", "zero")

# Every key KEDA itself reads from an `external` or `external-push` trigger's metadata. KEDA
# forwards the whole map to the scaler (`ScaledObjectRef.scalerMetadata`), these keys included, so
# the trigger parser accepts and ignores them. Source: kedacore/keda pkg/scalers/external_scaler.go,
# `externalScalerMetadata`, the fields tagged `order=triggerMetadata` (KEDA 2.17 to 2.20). Its other
# TLS fields, caCert, tlsClientCert and tlsClientKey, are `order=authParams`: read from the
# TriggerAuthentication only (since KEDA 2.11), never from metadata; tlsCertFile went in KEDA 2.17.
# KEDA validates these values itself (it rejects a trigger whose enableTLS is not a boolean), so
# any string is accepted here.
KEDA_FIELDS: tuple[Field, ...] = (
    Field(
        "scalerAddress",
        Scope.KEDA,
        _text,
        None,
        "host:port of this scaler",
        "Where KEDA dials this scaler.",
    ),
    Field(
        "enableTLS",
        Scope.KEDA,
        _text,
        None,
        "true | false (KEDA parses it)",
        "KEDA dials the scaler over TLS, verified against its system CAs, even with no caCert "
        "or client certificate in the TriggerAuthentication (KEDA >= 2.17).",
    ),
    Field(
        "unsafeSsl",
        Scope.KEDA,
        _text,
        None,
        "true | false (KEDA parses it)",
        "KEDA skips verifying the scaler's certificate; never set it (see Deploy, Security).",
    ),
)
KEDA_KEYS = tuple(f.key for f in KEDA_FIELDS)
# KEDA's TLS keys that it reads from the TriggerAuthentication only (above), yet older KEDA docs
# show under the trigger's metadata: an unknown key there says where it goes instead.
KEDA_AUTH_KEYS = ("caCert", "tlsClientCert", "tlsClientKey", "tlsCertFile")

FIELDS: tuple[Field, ...] = (
    *KEDA_FIELDS,
    # Identity and source of a workload: trigger metadata only.
    Field(
        "backend",
        Scope.TRIGGER,
        choice(*BACKENDS),
        None,
        " | ".join(BACKENDS),
        "Which inference server exposes the queue signals. `synthetic` is a built-in "
        "generator with a documented shape (quickstart, tests). Required.",
    ),
    Field(
        "serverAddress",
        Scope.TUNING,
        http_url,
        None,
        "an http(s):// base URL without query, e.g. http://prometheus.monitoring:9090",
        "Prometheus base URL (the name KEDA's own Prometheus scaler uses).",
    ),
    Field(
        "model",
        Scope.TRIGGER,
        pattern(r"[A-Za-z0-9._:/@+-]+", 256),
        None,
        "a model name of up to 256 characters from [A-Za-z0-9._:/@+-]",
        "Model label value: Triton `model`, vLLM `model_name`. Empty means every model "
        "the selected series carry.",
    ),
    Field(
        "labelSelector",
        Scope.TRIGGER,
        label_matchers,
        (),
        'comma-separated label matchers: name="value", name!="value", name=~"regex", '
        'name!~"regex" (quotes optional, at most 20)',
        "Extra label matchers that select this deployment's series, so two deployments of "
        'one model never mix, e.g. `namespace="inference",service="llama"`.',
    ),
    Field(
        "scrapeTargets",
        Scope.TRIGGER,
        host_ports,
        (),
        "comma-separated host:port list ([v6]:port for IPv6), at most 1000",
        "Pods to scrape directly, without Kubernetes discovery (non-Kubernetes use, tests).",
    ),
    Field(
        "profile",
        Scope.TRIGGER,
        pattern(NAME_RE, 63),
        None,
        "a profile name: lowercase letters, digits, '.', '_', '-'; at most 63",
        "A named tuning profile from the ConfigMap; its values sit between the ConfigMap "
        "defaults and this trigger's own keys.",
    ),
    Field(
        "metricName",
        Scope.TRIGGER,
        pattern(r"[A-Za-z0-9._-]+", 200),
        None,
        "up to 200 characters from [A-Za-z0-9._-]",
        "Override of the metric name shown in `kubectl get hpa`; sanitised like the default.",
    ),
    Field(
        "service",
        Scope.TRIGGER,
        pattern(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", 63),
        None,
        "a Kubernetes Service name (DNS label)",
        "Direct scrape: the Service whose EndpointSlices list the serving pods (in the "
        "ScaledObject's namespace); ready endpoints are scraped on metricsPort.",
    ),
    Field(
        "metricsPort",
        Scope.TRIGGER,
        integer(1, 65535),
        None,
        "an integer from 1 to 65535",
        "Direct scrape: the pods' metrics port; default 8002 for triton, 8000 for vllm.",
    ),
    Field(
        "metricsPath",
        Scope.TRIGGER,
        pattern(r"/[A-Za-z0-9._~/-]*", 200),
        "/metrics",
        "an absolute URL path",
        "Direct scrape: the metrics path on each pod.",
    ),
    Field(
        "signalSource",
        Scope.TUNING,
        choice("auto", "prometheus", "scrape"),
        "auto",
        "auto | prometheus | scrape",
        "Where live signals come from. `auto`: direct scrape when scrapeTargets or service "
        "is set (the fast path, no Prometheus scrape lag), else Prometheus. History for the "
        "warm start always comes from Prometheus when serverAddress is set.",
    ),
    Field(
        "namespaceLabel",
        Scope.TUNING,
        label_name_or_none,
        "namespace",
        "a Prometheus label name, or none",
        "The series label holding the pod's namespace; Prometheus queries are scoped to the "
        "ScaledObject's namespace with it (`none` to turn the scoping off).",
    ),
    Field(
        "rateWindowSeconds",
        Scope.TUNING,
        real(1, 3600),
        60.0,
        "a number of seconds from 1 to 3600",
        "Window for counter rates, histogram quantiles and derivatives (PromQL range and "
        "direct-scrape history). At least two scrape intervals.",
    ),
    Field(
        "maxSampleAgeSeconds",
        Scope.TUNING,
        real(1, 3600),
        60.0,
        "a number of seconds from 1 to 3600",
        "A sample older than this is missing, not current (a dead pod or stalled scrape).",
    ),
    Field(
        "scrapeTimeoutSeconds",
        Scope.TUNING,
        real(0.05, 30),
        1.0,
        "a number of seconds from 0.05 to 30",
        "Direct scrape: per-pod timeout; a pod that times out is left out with a reason.",
    ),
    Field(
        "queryTimeoutSeconds",
        Scope.TUNING,
        real(0.1, 60),
        3.0,
        "a number of seconds from 0.1 to 60",
        "Prometheus: timeout of one query attempt.",
    ),
    Field(
        "queryIntervalSeconds",
        Scope.TUNING,
        real(0, 600),
        5.0,
        "a number of seconds from 0 to 600",
        "Prometheus: query at most this often per workload (its data changes once per "
        "scrape interval anyway); between queries the last reading is reused.",
    ),
    *(
        Field(
            key,
            Scope.TUNING,
            promql,
            None,
            "a PromQL expression of up to 4000 characters",
            f"PromQL for `{signal}`, replacing the built-in one (required for backend custom: "
            "at least waitingQuery or runningQuery). `$model` and `$selector` are replaced by "
            "the model and the label matchers of this workload.",
        )
        for signal, key in (
            ("waiting", "waitingQuery"),
            ("running", "runningQuery"),
            ("arrival_rate", "arrivalRateQuery"),
            ("queue_time_mean_s", "queueTimeQuery"),
            ("queue_time_p99_s", "queueTimeP99Query"),
            ("ttft_p99_s", "ttftP99Query"),
            ("kv_cache_usage", "kvCacheQuery"),
            ("ready_pods", "readyPodsQuery"),
            ("service_time_s", "serviceTimeQuery"),
            ("prompt_tokens_rate", "promptTokensRateQuery"),
            ("generation_tokens_rate", "generationTokensRateQuery"),
        )
    ),
    # Synthetic generator (backend: synthetic).
    Field(
        "syntheticPattern",
        Scope.TRIGGER,
        choice(*SYNTHETIC_PATTERNS),
        "wave",
        " | ".join(SYNTHETIC_PATTERNS),
        "Shape of the synthetic arrival rate over one period: `wave` is a half-sine burst "
        "then idle for half the period (exercises scale to and from zero), `sine` swings "
        "between 10% and 100% of the peak, `constant` stays at the peak, `zero` is idle.",
    ),
    Field(
        "syntheticPeakRps",
        Scope.TRIGGER,
        real(0, 1e6),
        20.0,
        "a number from 0 to 1e6",
        "Peak arrival rate of the synthetic generator, requests per second.",
    ),
    Field(
        "syntheticPeriodSeconds",
        Scope.TRIGGER,
        real(1, 7 * 86400),
        600.0,
        "a number of seconds from 1 to 604800",
        "Period of the synthetic pattern.",
    ),
    Field(
        "syntheticServiceSeconds",
        Scope.TRIGGER,
        real(0.001, 3600),
        2.0,
        "a number of seconds from 0.001 to 3600",
        "Mean time one request holds a slot; in-flight = rate x service time (Little's law).",
    ),
    # Tuning: trigger metadata > profile > ConfigMap defaults > these built-in defaults.
    Field(
        "targetConcurrency",
        Scope.TUNING,
        real(0, 1e5, lo_open=True),
        8.0,
        "a number > 0 and <= 100000",
        "In-flight requests (running + waiting) one replica should carry.",
    ),
    Field(
        "serviceTimeSeconds",
        Scope.TUNING,
        real(0, 3600, lo_open=True),
        None,
        "a number of seconds > 0 and <= 3600",
        "Mean time one request holds a slot. Unset: measured as running / arrival rate "
        "(Little's law). Turns arrivals into replicas before a queue forms.",
    ),
    Field(
        "queueTimeSloSeconds",
        Scope.TUNING,
        real(0, 3600, lo_open=True),
        None,
        "a number of seconds > 0 and <= 3600",
        "Queue-time objective. While the measured queue time (p99, else mean) exceeds it, the "
        "need is at least what serves arrivals and drains the queue within it. Unset: off.",
    ),
    Field(
        "sloAttainment",
        Scope.TUNING,
        real(0.5, 0.9999),
        0.99,
        "a number from 0.5 to 0.9999",
        "Share of requests that should wait at most queueTimeSloSeconds: the objective the "
        "decision meets at the fewest GPU-hours. With queueTimeSloSeconds set, a closed loop "
        "raises the headroom over the need (up to 1.6x) while the share of requests late (read "
        "from the servers' queue-time mean and p99) exceeds 1 - this share, and lowers it while "
        "it is below, so the late share settles there. Higher buys fewer late requests with "
        "more idle slots; lower, the reverse.",
    ),
    Field(
        "prefillTokensPerSecond",
        Scope.TUNING,
        real(0, 1e9, lo_open=True),
        None,
        "a number of tokens per second > 0",
        "Prompt tokens one replica prefills per second at its target load (from a load test). "
        "With it (and/or decodeTokensPerSecond) the need is at least the GPU time the token "
        "rates take: prefill-heavy traffic saturates a replica long before its slots fill. "
        "Unset: off.",
    ),
    Field(
        "decodeTokensPerSecond",
        Scope.TUNING,
        real(0, 1e9, lo_open=True),
        None,
        "a number of tokens per second > 0",
        "Tokens one replica generates per second at its target load (targetConcurrency / the "
        "decode iteration time). See prefillTokensPerSecond. Unset: off.",
    ),
    Field(
        "kvCacheTarget",
        Scope.TUNING,
        real(0, 1, lo_open=True),
        0.9,
        "a number > 0 and <= 1",
        "The pods' mean KV-cache usage to stay under; above it the need is raised in proportion "
        "(memory-bound pods preempt before they reach targetConcurrency).",
    ),
    Field(
        "minReplicas",
        Scope.TUNING,
        integer(0, 10000),
        0,
        "an integer from 0 to 10000",
        "Lowest replica target the scaler returns (0 allows scale to zero).",
    ),
    Field(
        "maxReplicas",
        Scope.TUNING,
        integer(1, 10000),
        100,
        "an integer from 1 to 10000",
        "Highest replica target the scaler returns.",
    ),
    Field(
        "replicasPerNode",
        Scope.TUNING,
        integer(1, 64),
        1,
        "an integer from 1 to 64",
        "Replicas of this workload one GPU node holds (the node's GPUs / the GPUs one replica "
        "uses), for a workload with a NodePool of one node size to itself. Targets are rounded "
        "up to whole nodes: a node is billed whole, so the replicas that fill one already paid "
        "for cost nothing and absorb bursts, and a scale-down that empties no node saves "
        "nothing until Karpenter repacks it, which restarts the pods it moves. 1: no rounding.",
    ),
    Field(
        "coldStartSeconds",
        Scope.TUNING,
        real(0, 3600),
        180.0,
        "a number of seconds from 0 to 3600",
        "Time from asking for a replica to it serving: node launch + image pull + model load.",
    ),
    Field(
        "pollingIntervalSeconds",
        Scope.TUNING,
        real(1, 3600),
        30.0,
        "a number of seconds from 1 to 3600",
        "The ScaledObject's pollingInterval; part of the forecast horizon.",
    ),
    Field(
        "horizonSeconds",
        Scope.TUNING,
        real(0, 86400),
        None,
        "a number of seconds from 0 to 86400",
        "Forecast horizon; unset means coldStartSeconds + pollingIntervalSeconds.",
    ),
    Field(
        "forecast",
        Scope.TUNING,
        choice("on", "off", "wake"),
        "wake",
        "on | off | wake",
        "`on`: size for the forecast over the horizon: the target covers the q90 forecast of "
        "need within horizonSeconds (times the closed loop's headroom, as the need), and a "
        "workload the forecast expects traffic for stays (or turns) active; the simulator shows "
        "it costing more GPU-hours for about the same attainment on traffic that never idles "
        "(bench/results/decision.md), and a late-starting replica agrees with a running one once "
        "the forecaster's memory (~100 bins) is covered. `wake` (the default): only a workload "
        "that needed nothing for a whole scaleDownStabilizationSeconds (and for a horizon after) "
        "reads a forecast, its own demand over the coming horizon one period ago (and two, once "
        "two periods of seasonPeriodSeconds are held): it is kept, or brought back, a horizon "
        "before a recurring ramp, and a busy workload is sized by its need alone. `off`: no "
        "forecast.",
    ),
    Field(
        "forecastStepSeconds",
        Scope.TUNING,
        real(1, 3600),
        10.0,
        "a number of seconds from 1 to 3600",
        "Bin width of the need series the forecaster sees (and of its horizon steps).",
    ),
    Field(
        "seasonPeriodSeconds",
        Scope.TUNING,
        season_period,
        "auto",
        "auto, or a number of seconds from 0 to 604800 (0: no seasonal models)",
        "Period of the seasonal forecasts: the forecaster's seasonal candidates compete once the "
        "history covers two periods, and `forecast: wake` reads it once one period is held (at "
        "most 3 hours). `auto`: the period the workload's own demand recurs with, found by "
        "autocorrelation over its last 6 hours (10 minutes to under 6 hours; the daily period "
        "until one is found).",
    ),
    Field(
        "scaleDownStabilizationSeconds",
        Scope.TUNING,
        real(0, 3600),
        300.0,
        "a number of seconds from 0 to 3600",
        "The target never falls below the highest need seen in this window. Not set: 300 s, "
        "or the horizon (coldStartSeconds + pollingIntervalSeconds) when longer, so a replica "
        "is kept through a gap shorter than its cold start.",
    ),
    Field(
        "scaleDownMaxPercent",
        Scope.TUNING,
        real(1, 100),
        50.0,
        "a number from 1 to 100",
        "At most this share of the replicas (the highest target of the last 60 s) is removed "
        "per 60 s; 100 lifts the limit. Scale to zero after the idle window is not limited.",
    ),
    Field(
        "panicThreshold",
        Scope.TUNING,
        real(1.1, 100),
        2.0,
        "a number from 1.1 to 100",
        "Panic when the need reaches this multiple of the replicas already asked for (or, with "
        "forecast on, exceeds the q90 forecast by more than a replica): the target is the need "
        "at face value, and does not fall below the highest target since panic began until 60 s "
        "after demand last outran the ask.",
    ),
    Field(
        "scaleToZeroIdleSeconds",
        Scope.TUNING,
        real(0, 86400),
        300.0,
        "a number of seconds from 0 to 86400",
        "A workload turns inactive (IsActive false, target 0) only after this long with no "
        "request in flight or arriving.",
    ),
    # Process-wide: ConfigMap `server:` only.
    Field(
        "evaluationIntervalSeconds",
        Scope.SERVER,
        real(0.05, 300),
        5.0,
        "a number of seconds from 0.05 to 300",
        "How often each workload's background loop reads signals and decides. Ticks are "
        "aligned to the wall clock so every scaler replica decides at the same instants.",
    ),
    Field(
        "workloadIdleTimeoutSeconds",
        Scope.SERVER,
        real(1, 86400),
        900.0,
        "a number of seconds from 1 to 86400",
        "A workload's loop stops when KEDA has not asked about it for this long, counted "
        "once the loop has made its first decision.",
    ),
    Field(
        "staleTargetSeconds",
        Scope.SERVER,
        real(0, 86400),
        600.0,
        "a number of seconds from 0 to 86400",
        "With signals missing, the last good target is held this long (never lowered); "
        "after that GetMetrics fails so KEDA's `fallback` takes over.",
    ),
    Field(
        "firstDecisionTimeoutSeconds",
        Scope.SERVER,
        real(0, 60),
        2.0,
        "a number of seconds from 0 to 60",
        "How long a call about a workload seen for the first time waits for its first "
        "decision before answering UNAVAILABLE.",
    ),
)

BY_KEY: Mapping[str, Field] = {field.key: field for field in FIELDS}
TRIGGER_KEYS = tuple(f.key for f in FIELDS if f.scope in (Scope.KEDA, Scope.TRIGGER, Scope.TUNING))
TUNING_KEYS = tuple(f.key for f in FIELDS if f.scope is Scope.TUNING)
SERVER_KEYS = tuple(f.key for f in FIELDS if f.scope is Scope.SERVER)


# Where a key that another section takes belongs, as a hint names it.
BELONGS = {
    Scope.SERVER: "the `server:` section of the ConfigMap",
    Scope.TUNING: "`defaults:` or a profile",
    Scope.TRIGGER: "the ScaledObject's trigger metadata",
}
KEY_COMPARED_CHARS = 120  # of an unknown key, compared for a suggestion (difflib is quadratic)
HINTED_KEYS = 20  # unknown keys of one mapping that get a suggestion; the rest, the bare message
# What an unknown trigger key points to instead of listing every accepted key.
REFERENCE_POINTER = "accepted keys: see `scaler reference`"


def nearest_key(key: str, known: tuple[str, ...]) -> str | None:
    """The known key a misspelt one is nearest to: the same letters in another case first, then
    difflib's closest; None when nothing is close. The one place a key is suggested: trigger
    metadata (the gRPC error), the ConfigMap, and `scaler check` (a ScaledObject's fields too)."""
    near = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(
        key[:KEY_COMPARED_CHARS], known, n=1
    )
    return near[0] if near else None


def key_hint(key: str, known: tuple[str, ...]) -> str:
    """The hint for an unknown setting: where it belongs when another section takes it, else the
    accepted key it is nearest to, else ""."""
    if key in KEDA_AUTH_KEYS and key not in known:
        return (
            f"; KEDA reads {key} from the TriggerAuthentication (spec.secretTargetRef), not "
            "from trigger metadata"
            + (" (tlsCertFile: removed in KEDA 2.17)" if key == "tlsCertFile" else "")
        )
    elsewhere = BY_KEY.get(key)
    if elsewhere is not None and key not in known and elsewhere.scope in BELONGS:
        return f"; {key} belongs in {BELONGS[elsewhere.scope]}"
    near = nearest_key(key, known)
    return f"; did you mean {near!r}?" if near else ""


def parse_section(
    raw: Mapping[str, object], allowed: tuple[str, ...], prefix: str
) -> tuple[dict[str, Any], list[FieldError]]:
    """Parse a flat mapping of keys to raw values; collect every problem instead of stopping."""
    values: dict[str, Any] = {}
    problems: list[FieldError] = []
    unknown = 0
    for key, raw_value in raw.items():
        path = f"{prefix}{key}"
        if key not in allowed:
            unknown += 1
            hint = key_hint(str(key), allowed) if unknown <= HINTED_KEYS else ""
            tail = f" ({REFERENCE_POINTER})" if hint else f"; {REFERENCE_POINTER}"
            problems.append(FieldError(path, f"unknown key{hint}{tail}"))
            continue
        try:
            values[key] = BY_KEY[key].value(raw_value, path)
        except FieldError as exc:
            problems.append(exc)
    return values, problems


def check_bounds(values: Mapping[str, Any], prefix: str) -> list[FieldError]:
    """Rules that span two keys, checked wherever both are known."""
    lo, hi = values.get("minReplicas"), values.get("maxReplicas")
    if lo is not None and hi is not None and lo > hi:
        return [
            FieldError(
                f"{prefix}minReplicas",
                f"minReplicas ({lo}) must not exceed maxReplicas ({hi})",
            )
        ]
    return []
