"""Taking turns on the event loop: `Turnstile` lets evaluations through one per loop iteration,
`WarmStartTurn` is one admission to the warm starts' first-come, first-served queue."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Turnstile:
    """Lets waiters through one per event-loop iteration, in arrival order.

    Phases spread the workloads' ticks over the interval, but loops still wake together (a
    timer late behind a pause, close phases, warm starts of workloads seen at once), and a
    thousand loops evaluating back to back would hold the event loop, and every RPC with it, for
    the whole burst (on one shared grid, the RPCs' p99 in `scaler bench load`). A loop
    takes a turn before each evaluation, and a warm start's replay before each slice of it: a
    burst is spread over as many iterations and the loop polls for I/O, so answers RPCs, between
    any two. Nothing is held after the turn: a source's network reads still overlap."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._granting = False

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        if not self._granting:
            self._granting = True
            loop.call_soon(self._grant, loop)
        await turn

    def _grant(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a cancelled waiter gives its turn to the next
                turn.set_result(None)
                break
        if self._waiting:
            loop.call_soon(self._grant, loop)  # the next turn in the next iteration
        else:
            self._granting = False


class WarmStartTurn:
    """One admission to the warm starts' queue (a FIFO semaphore), given back at most once: at
    the end, or early by `patiently` when a read outlasts its patience."""

    def __init__(self, queue: asyncio.Semaphore) -> None:
        self._queue = queue
        self.held = False

    async def __aenter__(self) -> WarmStartTurn:
        await self._queue.acquire()
        self.held = True
        return self

    async def __aexit__(self, *_: object) -> None:
        self.give_back()

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._queue.release()

    async def patiently(self, read: Coroutine[Any, Any, T], patience_s: float) -> T:
        """`read`'s result; if it takes longer than `patience_s`, the turn is given back while
        it goes on (the read itself is never cut short here; its own timeouts apply)."""
        task = asyncio.ensure_future(read)
        try:
            done, _ = await asyncio.wait({task}, timeout=patience_s)
            if not done:
                self.give_back()
            return await task
        finally:
            task.cancel()  # a no-op once done; ends the read if this warm start is cancelled
