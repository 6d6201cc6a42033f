"""StateChanges: tasks wait for the pool's state to change instead of polling it.

Rules
-----
* Whoever changes state that another task may wait for calls `notify()`, a plain call that
  costs one attribute test when nobody waits (it runs on every request's release):
  - a replica's lifecycle (`DeploymentPolicy.set_lifecycle`),
  - a replica's in-flight count going down (`DeploymentPolicy.release`),
  - the published replica set (`DeploymentPolicy.publish`: a reload, a discovery join),
  - a discovery group's resolution (`DiscoveryGroup.resolve_once`).
* A waiter states what it waits for as a predicate over that state:
  `await changes.wait_until(predicate)` returns as soon as `predicate()` is true. The
  predicate is re-checked after every notify, and it is checked and the wait begun with no
  checkpoint between them, so no change is missed. Bound the wait with a cancel scope.
* Changes that happen by time alone (a backoff or an ejection ending) are not notified:
  nothing waits for them here (`DeploymentPool._timers` reports them on its own clock).

One object per router (the Supervisor's), shared by every deployment's policy: readiness
and a reload's warm-up look across deployments.
"""

from __future__ import annotations

from collections.abc import Callable

import trio


class StateChanges:
    def __init__(self) -> None:
        # Made by the first waiter, consumed by the next notify: a notify with nobody
        # waiting allocates nothing.
        self._event: trio.Event | None = None

    def notify(self) -> None:
        """Wake every task waiting in `wait_until` to re-check its predicate."""
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` is true: at once, or after the notify that made it so.
        It returns right after a true check, never yielding in between, so the caller
        acts on the state it waited for."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not predicate():
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
