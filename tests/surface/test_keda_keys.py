"""KEDA's own trigger keys: KEDA reads them from an external trigger's metadata and forwards the
whole map to the scaler, so the scaler must accept them (and ignore them), on the path the server
runs and in the settings reference."""

from __future__ import annotations

import re

import pytest

from gpu_queue_scaler.settings import fields
from gpu_queue_scaler.settings.reference import markdown
from gpu_queue_scaler.settings.trigger import TriggerCache, parse_trigger
from tests.conftest import ServerFactory, ref, synthetic

# What KEDA 2.20's pkg/scalers/external_scaler.go reads from trigger metadata
# (`order=triggerMetadata` in externalScalerMetadata), with a value KEDA accepts for each.
KEDA_VALUES = {"scalerAddress": "127.0.0.1:6000", "enableTLS": "true", "unsafeSsl": "false"}


def test_the_list_is_kedas_trigger_metadata_keys_and_nothing_else() -> None:
    assert set(fields.KEDA_KEYS) == set(KEDA_VALUES)
    assert all(f.scope is fields.Scope.KEDA for f in fields.KEDA_FIELDS)
    assert set(fields.KEDA_KEYS) <= set(fields.TRIGGER_KEYS)
    assert not set(fields.KEDA_KEYS) & set(fields.TUNING_KEYS)  # never a ConfigMap key


@pytest.mark.parametrize("key", sorted(KEDA_VALUES))
@pytest.mark.parametrize("value", ["true", "false", "TRUE", "1"])
def test_each_keda_key_is_accepted_and_changes_nothing(key: str, value: str) -> None:
    value = KEDA_VALUES[key] if key == "scalerAddress" else value
    plain = {k: v for k, v in synthetic().items() if k != "scalerAddress"}
    with_key = {**plain, key: value}
    cache = TriggerCache()  # the parser the server runs
    got = cache.parse("team-a", "chat", with_key)
    want = parse_trigger("team-a", "chat", plain)
    assert (got.backend, got.metric_name, got.tuning()) == (
        want.backend,
        want.metric_name,
        want.tuning(),
    )


async def test_a_trigger_with_every_keda_key_is_served(start_server: ServerFactory) -> None:
    """Over real gRPC: GetMetricSpec, GetMetrics and IsActive all answer for a trigger that sets
    enableTLS and unsafeSsl next to scalerAddress (they were INVALID_ARGUMENT)."""
    _, client = await start_server()
    evaluation = await client.evaluate(ref("chat", synthetic(**KEDA_VALUES)))
    assert evaluation.target == 1.0
    assert evaluation.value >= 1.0


def test_the_reference_lists_the_keda_keys_as_kedas() -> None:
    rows = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line)]  # `\|` is a pipe in a cell
        for line in markdown().splitlines()
        if line.startswith("| `")
    ]
    where = {cells[1]: cells[4] for cells in rows}
    for key in KEDA_VALUES:
        assert where[f"`{key}`"] == "KEDA's (ignored here)", key
    assert "trigger" in where["`backend`"]
    assert "pkg/scalers/external_scaler.go" in markdown()


def test_an_unknown_key_is_still_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="enableTls: unknown key; did you mean 'enableTLS'"):
        parse_trigger("team-a", "chat", synthetic(enableTls="true"))


@pytest.mark.parametrize("key", fields.KEDA_AUTH_KEYS)
def test_a_tls_key_keda_reads_from_the_trigger_authentication_says_where_it_goes(
    key: str,
) -> None:
    """Older KEDA docs show caCert and the client certificate under the trigger's metadata; KEDA
    reads them from the TriggerAuthentication only, so the error says so instead of a near key."""
    expected = f"{key}: unknown key; KEDA reads {key} from the TriggerAuthentication"
    with pytest.raises(ValueError, match=expected):
        parse_trigger("team-a", "chat", synthetic(**{key: "/certs/ca.pem"}))
