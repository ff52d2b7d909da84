"""The test servers' one rule for a port taken between choosing it and binding it
(`tests.servers.base.start_retrying_taken_ports`), on real loopback sockets."""

from __future__ import annotations

import socket

import pytest

from tests.servers.base import START_ATTEMPTS, start_retrying_taken_ports
from tests.servers.ports import free_port


def test_a_taken_port_is_picked_again_and_the_start_succeeds() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        chosen: list[int] = []

        def pick(attempt: int) -> None:
            chosen.append(taken if attempt == 1 else free_port())

        def launch() -> socket.socket:
            server = socket.socket()
            try:
                server.bind(("127.0.0.1", chosen[-1]))  # OSError: [Errno 98] Address already in use
            except OSError:
                server.close()
                raise
            return server

        with start_retrying_taken_ports(pick, launch) as server:
            assert server.getsockname()[1] == chosen[-1] != taken
        assert len(chosen) == 2


def test_any_other_failure_is_raised_at_once() -> None:
    picks: list[int] = []

    def launch() -> None:
        raise RuntimeError("model weights not found")

    with pytest.raises(RuntimeError, match="weights"):
        start_retrying_taken_ports(picks.append, launch)
    assert picks == [1]


def test_a_port_taken_every_time_fails_after_the_last_attempt() -> None:
    picks: list[int] = []

    def launch() -> None:
        raise OSError(98, "Address already in use")

    with pytest.raises(OSError, match="in use"):
        start_retrying_taken_ports(picks.append, launch)
    assert picks == list(range(1, START_ATTEMPTS + 1))
