"""How many refused logins from one address the log tells in full (issue 37).

A client retrying a wrong password in a loop, or someone guessing, must not flood the log: per
address, the first ``burst`` refusals in a window (a minute) are logged in full (user, address,
why: ``workers.server._log_closed``), the rest only counted, and when the window ends one line
says how many were left out. The addresses are an LRU of bounded size, so memory stays bounded
whatever the number of addresses refused; an address pushed out of it has its count told then.
Pure (the clock is injected), one per worker process.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

BURST = 5  # refusals per address per window logged in full
WINDOW = 60.0  # seconds
MAX_ADDRESSES = 1024  # addresses remembered at once


class _Window:
    __slots__ = ("count", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.count = 0


class LoginFailureLog:
    """Refused logins per address: whether to log each in full, and the summaries of those not."""

    def __init__(
        self, *, burst: int = BURST, window: float = WINDOW, max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.window = window
        self.max_addresses = max_addresses
        self._clock = clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()  # least recently refused first
        self._pending: list[str] = []  # summaries of windows that ended or were pushed out

    def __len__(self) -> int:
        return len(self._windows)

    def failure(self, address: str) -> bool:
        """Count one refused login from ``address``; True when the log should tell it in full."""
        now = self._clock()
        current = self._windows.get(address)
        if current is not None and now - current.started >= self.window:
            self._end(address, current)
            current = None
        if current is None:
            current = self._windows[address] = _Window(now)
            while len(self._windows) > self.max_addresses:
                oldest, evicted = self._windows.popitem(last=False)
                self._end(oldest, evicted)
        else:
            self._windows.move_to_end(address)
        current.count += 1
        return current.count <= self.burst

    def summaries(self) -> list[str]:
        """The lines owed now: one per address whose window ended with refusals left out (or that
        the LRU pushed out); addresses whose window ended are forgotten."""
        now = self._clock()
        ended = [(address, w) for address, w in self._windows.items()
                 if now - w.started >= self.window]
        for address, w in ended:
            del self._windows[address]
            self._end(address, w)
        pending, self._pending = self._pending, []
        return pending

    def _end(self, address: str, w: _Window) -> None:
        left_out = w.count - self.burst
        if left_out > 0:
            self._pending.append(
                f"{left_out} more login failure{'s' if left_out != 1 else ''} from {address} "
                "in the last minute")
