"""labelSelector's regexes run on RE2 (`gpu_queue_scaler.settings.labelregex`): linear time on the
event loop of every direct-scrape read, and Prometheus's own syntax, checked when the trigger is
parsed."""

from __future__ import annotations

import time

import pytest

from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import resolve
from gpu_queue_scaler.settings.trigger import TriggerError, parse_trigger
from gpu_queue_scaler.sources.exposition import matches
from gpu_queue_scaler.sources.scrape import ScrapeSource
from tests.servers.prometheus import MetricsEndpoint


def trigger(selector: str) -> dict[str, str]:
    return {
        "backend": "vllm",
        "model": "m",
        "scrapeTargets": "127.0.0.1:1",
        "labelSelector": selector,
    }


@pytest.mark.timeout(60)
async def test_a_backtracking_pattern_is_matched_in_linear_time_by_direct_scrape():
    """`(a|aa)*c` against 64 a's: Python's re takes ~2.6x longer per two more characters (a
    tenth of a second at 30): years here. RE2 answers at once; the bound on this test is
    pytest's timeout, not a timed assertion."""
    value = "a" * 64
    body = (
        f'vllm:num_requests_waiting{{model_name="m",engine="{value}"}} 3\n'
        'vllm:num_requests_waiting{model_name="m",engine="aac"} 5\n'
    )
    with MetricsEndpoint(body) as pod:
        metadata = {**trigger('engine=~"(a|aa)*c"'), "scrapeTargets": pod.target}
        spec = resolve(parse_trigger("team-a", "m", metadata), Config())
        source = ScrapeSource()
        try:
            signal = await source.read(spec, time.time())
        finally:
            await source.close()
    assert signal.waiting == 5  # only the series the pattern matches


def test_a_pattern_re2_refuses_is_a_trigger_error_naming_labelselector():
    """A lookbehind compiles under Python's re but not under RE2 (nor Prometheus's Go regexp):
    refused when the trigger is parsed, not at the first read."""
    with pytest.raises(TriggerError) as info:
        parse_trigger("team-a", "m", trigger('engine=~"(?<=a)b"'))
    assert [p.path for p in info.value.problems] == ["labelSelector"]
    assert "invalid perl operator" in str(info.value)


def test_re2_syntax_that_python_refuses_is_accepted_and_matches():
    """`\\pL` (a Unicode letter) is RE2's and Go's, not Python's: the selector means what it
    means to Prometheus."""
    parse_trigger("team-a", "m", trigger(r'engine=~"\\pL+"'))
    assert matches((("engine", "é"),), (("engine", "=~", r"\pL+"),))
    assert not matches((("engine", "1"),), (("engine", "=~", r"\pL+"),))


@pytest.mark.parametrize("pattern", ["a{1001}", "a{99999999999}", "(" * 1001 + ")" * 1001])
def test_patterns_go_would_refuse_are_refused(pattern: str):
    """Counts over 1,000 (RE2 reads one past 10^8 as literal text) and nesting over 1,000 deep
    (RE2 takes it): Go's regexp, Prometheus's, refuses both."""
    with pytest.raises(TriggerError) as info:
        parse_trigger("team-a", "m", trigger(f'engine=~"{pattern}"'))
    assert [p.path for p in info.value.problems] == ["labelSelector"]
