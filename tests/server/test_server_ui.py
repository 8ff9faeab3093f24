"""``/ui``: the packaged page is served with its security headers and holds no data.

The browser tests (tests/test_ui_browser.py) need chromium; these do not.
"""

from __future__ import annotations

import re

import pytest

from flowmem.server._routes_ui import ASSETS
from server_support import make_world


@pytest.mark.parametrize("path", ["/ui", *(f"/ui/{name}" for name in ASSETS)])
def test_the_page_and_its_assets_are_served_with_a_strict_policy(path: str) -> None:
    world = make_world(seed=False)
    response = world.call("anonymous", "GET", path)  # static, no data: no token needed
    assert response.status_code == 200
    assert response.headers["content-type"].split(";")[0] in {"text/html", "text/css",
                                                              "text/javascript"}
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in response.headers


def test_the_page_has_no_inline_script_and_no_outside_reference() -> None:
    world = make_world(seed=False)
    html = world.call("anonymous", "GET", "/ui").text
    scripts = re.findall(r"<script([^>]*)>", html)
    assert scripts and all('src="/ui/' in attributes for attributes in scripts)
    assert not re.search(r"\bon[a-z]+=", html)  # no inline handlers either
    for name in ASSETS:
        text = world.call("anonymous", "GET", f"/ui/{name}").text
        assert not re.search(r"https?://", text), name  # no CDN, nothing outside
    script = world.call("anonymous", "GET", "/ui/app.js").text
    assert "innerHTML" not in script and "document.cookie" not in script
    assert "sessionStorage" in script and "localStorage" not in script


def test_an_unknown_asset_is_an_ordinary_404() -> None:
    world = make_world(seed=False)
    for path in ("/ui/secret.py", "/ui/..%2Fapp.py", "/ui/static"):
        response = world.call("anonymous", "GET", path)
        assert (response.status_code, response.json()["error_code"]) == (404, "route_not_found")
