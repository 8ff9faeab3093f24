"""The tally of the attack suite: requests sent, cases checked, deviations, 5xx.

Every request of ``tests/security`` goes through :class:`AttackClient` (the
ASGI app) or :func:`attack_http` (a real ``flowmem serve``); every expected
outcome is one :func:`expect` case. A case that deviates is recorded and
fails its test at the end (:func:`no_deviations`), so one run reports them all.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx

from flowmem.server import Settings
from server_support import CheckedClient, World, check_envelope, make_world

TALLY: Counter[str] = Counter()
DEVIATIONS: list[str] = []
_LOCK = threading.Lock()


def _count(response: Any) -> None:
    with _LOCK:
        TALLY["requests"] += 1
        if response.status_code >= 500:
            TALLY["5xx"] += 1


class AttackClient(CheckedClient):
    """The checked ASGI client, counting every request."""

    def request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        response = super().request(*args, **kwargs)
        _count(response)
        return response


def attack_world(settings: Settings | None = None, *, seed: bool = True,
                 store: str = "memory://") -> World:
    """A world whose client counts (see ``server_support.make_world``)."""
    world = make_world(store, settings, seed=False, client_class=AttackClient)
    if seed:
        from server_support import USERS
        world.session_id = world.new_session("owner", "seeded")
        world.call("owner", "POST", f"/v1/sessions/{world.session_id}/viewers",
                   {"user_id": USERS["viewer"]})
        world.call("owner", "POST", f"/v1/sessions/{world.session_id}/turns",
                   {"messages": [{"role": "user", "content": "hello"}]})
    return world


def _hook(response: httpx.Response) -> None:
    _count(response)
    check_envelope(response)


def attack_http(base: str, **kwargs: Any) -> httpx.Client:
    """An httpx client on a live server, counting and checking every response."""
    return httpx.Client(base_url=base, timeout=kwargs.pop("timeout", 15),
                        event_hooks={"response": [_hook]}, **kwargs)


def expect(what: str, response: Any, status: int, code: str | None = None) -> bool:
    """One case: ``response`` has ``status`` (and ``error_code``); a miss is a deviation."""
    got_code = None
    if response.status_code >= 400:
        try:
            got_code = response.json().get("error_code")
        except ValueError:
            got_code = "<not JSON>"
    ok = response.status_code == status and (code is None or got_code == code)
    return case(what, ok, f"got {response.status_code} {got_code}, expected {status} {code}")


def case(what: str, ok: bool, detail: str = "") -> bool:
    """One checked expectation."""
    with _LOCK:
        TALLY["cases"] += 1
        if not ok:
            TALLY["deviations"] += 1
            DEVIATIONS.append(f"{what}: {detail}")
    return ok


def no_deviations(prefix: str = "") -> None:
    """Fail the calling test if any case (with this prefix) deviated."""
    mine = [d for d in DEVIATIONS if d.startswith(prefix)]
    assert not mine, "\n".join(mine[:40])
