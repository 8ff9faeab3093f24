"""The transcript page (/ui) in a real browser against a real ``flowmem serve``.

Debian's ``chromium``, driven by Playwright for Python (its own browser
download is never used). The page must work under the service's
authorization exactly as the API does: sign in with a token, see one's own
and shared sessions, a transcript with tool-call cards paired by call id, a
healed placeholder (MEM-3) and a late result that replaced its placeholder
(MEM-10), the delta of each append (MEM-14), paging back, live updates; a
viewer sees no driving controls (MEM-9); a stranger's session is not
reachable (404 before 403).

``FLOWMEM_UI_SCREENSHOTS=docs`` writes the screenshots of docs/ui.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_support import flowmem, free_port, serving

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed "
                       "(apt-get install -y chromium; .ci/run does it)"),
    # one xdist worker: one served store and one chromium for the whole module
    pytest.mark.xdist_group("ui_browser")]
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="Playwright for Python is not installed (pip install "
                                      "playwright; never `playwright install`)")

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SLOT = 1 << 20
WAIT = 15_000  # ms a live update may take to show (the stream polls twice a second)
SHOTS = Path(__file__).resolve().parents[2] / "docs" \
    if os.environ.get("FLOWMEM_UI_SCREENSHOTS") == "docs" else None


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class Site:
    """A served store with tokens for alice (owner), bob (viewer), carol, root (admin)."""

    def __init__(self, client: httpx.Client, store: str, base: str) -> None:
        self.client = client
        self.base = base
        self.tokens = {user: subprocess.run(
            flowmem("token", "create", "--user", user, "--store", store,
                    *(["--admin"] if user == "root" else [])),
            check=True, capture_output=True, text=True).stdout.strip()
            for user in ("alice", "bob", "carol", "root")}

    def call(self, user: str, method: str, path: str, body: Any = None) -> Any:
        response = self.client.request(method, path, json=body,
                                       headers={"Authorization": f"Bearer {self.tokens[user]}"})
        assert response.status_code < 300, response.text
        return response.json()["data"]

    def session(self, user: str, title: str) -> str:
        return str(self.call(user, "POST", "/v1/sessions", {"title": title})["id"])

    def turn(self, user: str, session_id: str, *messages: dict[str, Any]) -> Any:
        return self.call(user, "POST", f"/v1/sessions/{session_id}/turns",
                         {"messages": list(messages)})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    store = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'ui.db'}"
    port = free_port()
    with serving(store, port, "--rate-limit", "0") as client:
        yield Site(client, store, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1180, "height": 900})
    opened = context.new_page()
    yield opened
    context.close()


def weather(site: Site) -> str:
    """alice's session: three calls; one answered, one healed, one healed then late (MEM-10)."""
    sid = site.session("alice", "weather in Paris")
    site.turn("alice", sid, {"role": "user", "content": "Weather, time and news in Paris?"},
              {"role": "assistant", "content": "Looking that up.", "tool_calls": [
                  _call("call_w", "weather", '{"city": "Paris"}'),
                  _call("call_t", "time", '{"tz": "Europe/Paris"}'),
                  _call("call_n", "news", '{"topic": "Paris"}')]},
              {"role": "tool", "tool_call_id": "call_w", "content": "sunny, 21 C"})
    healed = site.turn("alice", sid, {"role": "user", "content": "Still there?"})
    assert healed["appended"] == 1 and healed["count"] == 6  # two placeholders (MEM-3)
    late = site.turn("alice", sid, {"role": "tool", "tool_call_id": "call_t",
                                    "content": "14:05 CET"})
    assert (late["appended"], late["count"]) == (0, 6)  # replaced in place (MEM-10, MEM-14)
    site.call("alice", "POST", f"/v1/sessions/{sid}/viewers", {"user_id": "bob"})
    return sid


def sign_in(page: Any, site: Site, user: str, fragment: str = "") -> None:
    page.goto(f"{site.base}/ui{fragment}")
    page.fill("#token", site.tokens[user])
    page.click("#signin-button")
    page.wait_for_selector(f"body[data-signed-in={user}]")


def open_session(page: Any, sid: str) -> None:
    page.click(f"[data-session='{sid}']")
    page.wait_for_selector(f"[data-testid=transcript][data-loaded='{sid}']")


def shot(page: Any, name: str) -> None:
    if SHOTS is not None:
        page.screenshot(path=str(SHOTS / name), full_page=True)


def test_sign_in_keeps_the_token_in_the_tab_and_sets_no_cookie(page: Any, site: Site) -> None:
    page.goto(f"{site.base}/ui")
    page.fill("#token", "fm_not-a-token")
    page.click("#signin-button")
    page.wait_for_selector("[data-testid=error]:not([hidden])")
    assert "refused" in page.inner_text("[data-testid=error]")
    sign_in(page, site, "alice")
    assert page.inner_text("[data-testid=whoami]") == "alice"
    assert page.evaluate("sessionStorage.getItem('flowmem.token')") == site.tokens["alice"]
    assert page.evaluate("document.cookie") == "" and page.context.cookies() == []
    page.click("#signout")
    assert page.evaluate("sessionStorage.getItem('flowmem.token')") is None


def test_the_transcript_pairs_calls_and_marks_heals_and_late_results(page: Any,
                                                                     site: Site) -> None:
    sid = weather(site)
    sign_in(page, site, "alice")
    assert page.locator(f"#owned [data-session='{sid}']").count() == 1
    open_session(page, sid)
    roles = page.locator("[data-testid=message]").evaluate_all(
        "items => items.map(i => i.dataset.role)")
    assert roles == ["user", "assistant", "tool", "tool", "tool", "user"]
    cards = {c: page.locator(f"[data-testid=call][data-call-id={c}]")
             for c in ("call_w", "call_t", "call_n")}
    assert '"city": "Paris"' in cards["call_w"].locator("[data-testid=arguments]").inner_text()
    assert cards["call_w"].locator("[data-testid=result]").inner_text() == "sunny, 21 C"
    assert cards["call_w"].locator(".badge").count() == 0
    assert cards["call_t"].locator("[data-testid=badge-late]").count() == 1  # MEM-10
    assert cards["call_t"].locator("[data-testid=result]").inner_text() == "14:05 CET"
    assert cards["call_n"].locator("[data-testid=badge-healed]").count() == 1  # MEM-3
    positions = {m.get_attribute("data-position"): m for m in
                 page.locator("[data-testid=message][data-role=tool]").all()}
    late = [int(p) for p, m in positions.items()
            if m.locator("[data-testid=badge-late]").count()]
    healed = [int(p) for p, m in positions.items()
              if m.locator("[data-testid=badge-healed]").count()]
    assert len(late) == 1 and late[0] % SLOT != 0  # the placeholder's slot
    assert len(healed) == 1 and healed[0] == late[0] + 1
    assert page.inner_text("[data-testid=counts]") == "showing 6 of 6 messages"
    assert page.locator("[data-testid=controls]").count() == 1  # the owner drives
    shot(page, "ui-transcript.png")


def test_live_updates_show_each_append_and_its_delta(page: Any, site: Site) -> None:
    sid = site.session("alice", "live")
    site.turn("alice", sid, {"role": "user", "content": "Book a table"})
    sign_in(page, site, "alice")
    open_session(page, sid)
    page.wait_for_selector("[data-testid=live]:text('live')")
    site.turn("alice", sid, {"role": "assistant", "content": "", "tool_calls": [
        _call("call_b", "book", '{"people": 2}')]})
    page.wait_for_selector("[data-testid=call][data-call-id=call_b] [data-testid=badge-pending]",
                           timeout=WAIT)
    site.turn("alice", sid, {"role": "user", "content": "Hello?"})  # heals call_b (MEM-3)
    page.wait_for_selector("[data-call-id=call_b] [data-testid=badge-healed]", timeout=WAIT)
    site.turn("alice", sid, {"role": "tool", "tool_call_id": "call_b", "content": "booked, 8pm"})
    page.wait_for_selector("[data-call-id=call_b] [data-testid=badge-late]", timeout=WAIT)
    deltas = page.locator("[data-testid=delta][data-source=live]")
    assert [d.get_attribute("data-appended") for d in deltas.all()] == ["0", "1", "1"]
    assert deltas.first.get_attribute("data-count") == "4"
    assert "late result" in deltas.first.inner_text()
    page.fill("#composer", "Thanks!")
    page.click("#send")
    page.wait_for_selector("[data-testid=delta][data-source=turn]")
    turn = page.locator("[data-testid=delta][data-source=turn]")
    assert (turn.get_attribute("data-appended"), turn.get_attribute("data-count")) == ("1", "5")
    page.wait_for_selector("[data-testid=message][data-role=user] >> text=Thanks!")
    shot(page, "ui-live.png")


def test_a_viewer_sees_the_transcript_but_no_driving_controls(page: Any, site: Site) -> None:
    sid = weather(site)
    sign_in(page, site, "bob")
    assert page.locator(f"#shared [data-session='{sid}']").count() == 1
    assert page.locator(f"#owned [data-session='{sid}']").count() == 0
    open_session(page, sid)
    assert page.inner_text("[data-testid=role]") == "viewing (read only)"
    for control in ("[data-testid=controls]", "#composer", "#send", "#stop", "#reset"):
        assert page.locator(control).count() == 0, control  # MEM-9
    page.wait_for_selector("[data-testid=live]:text('live')")  # viewers follow live too
    site.turn("alice", sid, {"role": "user", "content": "for bob to see"})
    page.wait_for_selector("text=for bob to see", timeout=WAIT)
    shot(page, "ui-viewer.png")


def test_a_strangers_session_is_not_reachable(page: Any, site: Site) -> None:
    sid = weather(site)
    sign_in(page, site, "carol", f"#session={sid}")
    page.wait_for_selector("[data-testid=error]:not([hidden])")
    assert "No such session" in page.inner_text("[data-testid=error]")
    assert page.locator("[data-testid=message]").count() == 0
    assert page.locator(f"[data-session='{sid}']").count() == 0
    statuses = page.evaluate("""async (sid) => {
        const auth = {Authorization: 'Bearer ' + sessionStorage.getItem('flowmem.token')};
        const out = [];
        for (const path of ['', '/messages', '/events'])
            out.push((await fetch('/v1/sessions/' + sid + path, {headers: auth})).status);
        return out;
    }""", sid)
    assert statuses == [404, 404, 404]  # absence before denial, the stream too


def test_paging_back_through_a_long_conversation(page: Any, site: Site) -> None:
    sid = site.session("alice", "long")
    for n in range(35):
        site.turn("alice", sid, {"role": "user", "content": f"question {n}"},
                  {"role": "assistant", "content": f"answer {n}"})
    sign_in(page, site, "alice")
    open_session(page, sid)
    assert page.inner_text("[data-testid=counts]") == "showing 30 of 70 messages"
    page.click("[data-testid=older]")
    page.wait_for_selector("[data-testid=counts]:text('showing 60 of 70')")
    page.click("[data-testid=older]")
    page.wait_for_selector("[data-testid=counts]:text('showing 70 of 70')")
    assert page.locator("[data-testid=older]").is_hidden()
    assert page.locator("[data-testid=message]").first.inner_text().endswith("question 0")


def test_stored_text_is_shown_as_text_never_as_html(page: Any, site: Site) -> None:
    sid = site.session("alice", "<b>bold</b>")
    site.turn("alice", sid, {"role": "user",
                             "content": "<img src=x onerror=\"window.pwned=1\"><script>"
                                        "window.pwned=2</script>"})
    sign_in(page, site, "alice")
    open_session(page, sid)
    assert "<img src=x" in page.inner_text("[data-testid=message] pre")
    assert page.locator("[data-testid=messages] img, [data-testid=messages] script").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.inner_text("#session-title") == "<b>bold</b>"


SIZES = {"phone": (390, 844), "desktop": (1280, 800)}


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_page_fits_a_phone_and_a_desktop(browser: Any, site: Site, size: str) -> None:
    """No sideways scroll and the whole transcript in view at 390×844 and 1280×800; badges on
    one line; writes docs/ui-phone.png and docs/ui-desktop.png (shown in docs/ui.md)."""
    width, height = SIZES[size]
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        sid = weather(site)
        site.turn("alice", sid, {"role": "user", "content": "And tomorrow?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [_call("call_f", "forecast", '{"city": "Paris"}')]},
                  {"role": "tool", "tool_call_id": "call_f", "content": "rain"})
        page.goto(f"{site.base}/ui")
        page.wait_for_selector("#signin", state="visible")
        assert not page.is_visible("#app")  # the sign-in screen shows no empty app behind it
        sign_in(page, site, "alice", f"#session={sid}")
        page.wait_for_selector(f"[data-testid=transcript][data-loaded='{sid}']")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        transcript = page.locator("[data-testid=transcript]").bounding_box()
        assert transcript is not None and transcript["x"] + transcript["width"] <= width + 1
        for badge in page.locator(".badge").all():
            box = badge.bounding_box()
            assert box is not None and box["height"] < 30, box  # one line, not an oval
        numbers = page.locator("[data-testid=number]").all_inner_texts()
        assert numbers == [str(n) for n in range(1, len(numbers) + 1)]
        assert page.locator("[data-testid=number]").first.get_attribute(
            "title", timeout=WAIT).startswith("stored position ")
        shown = page.inner_text("body")
        assert "null" not in page.locator("#messages pre.content").all_inner_texts()
        assert "MEM-" not in shown
        page.screenshot(path=str(Path(__file__).resolve().parents[2] / "docs" /
                                 f"ui-{size}.png"), full_page=False)
        icon = site.client.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")
    finally:
        context.close()
