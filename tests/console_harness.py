"""The console on a real HTTP server (uvicorn, in a thread of the test process, beside the release
flows the tests run) for a test home with Adult registered and a Prefect API, and people who sign in
to it with software passkeys (passkey_device.py)."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from http.cookies import SimpleCookie

import httpx
from passkey_device import PasskeyDevice


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def console_server(settings, port: int | None = None):
    """The console for `settings` on 127.0.0.1:PORT (origin http://localhost:PORT); yields its origin."""
    import uvicorn

    from dprelease.cli.console.app import create_app
    from dprelease.cli.console.server import relying_party

    port = port or free_port()
    rp = relying_party(port, None, None)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, rp), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the console did not start")
        time.sleep(0.05)
    try:
        yield rp.origin
    finally:
        server.should_exit = True
        thread.join()


class Browser:
    """What a browser does for one person: keeps the console's cookies (Secure cookies too: the
    console is on localhost), sends the page's CSRF token and its own Origin, holds their passkey."""

    def __init__(self, origin: str, device: PasskeyDevice | None = None) -> None:
        self.origin = origin
        self.http = httpx.Client(base_url=origin.replace("localhost", "127.0.0.1"), timeout=300)
        self.cookies: dict[str, str] = {}
        self.csrf = ""
        self.device = device or PasskeyDevice(origin, "localhost")

    def _keep(self, response: httpx.Response) -> httpx.Response:
        for header in response.headers.get_list("set-cookie"):
            jar = SimpleCookie()
            jar.load(header)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0" or morsel.value in ("", '""'):
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        marker = 'name="csrf-token" content="'
        if marker in response.text:
            self.csrf = response.text.split(marker, 1)[1].split('"', 1)[0]
        return response

    def _cookie_header(self) -> dict:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}

    def get(self, path: str) -> httpx.Response:
        return self._keep(self.http.get(path, headers=self._cookie_header()))

    def post(self, path: str, json: dict | None = None, csrf: str | None = None, origin: str | None = None,
             form: dict | None = None) -> httpx.Response:
        headers = {**self._cookie_header(), "Origin": origin or self.origin}
        token = self.csrf if csrf is None else csrf
        if form is not None:
            return self._keep(self.http.post(path, data={**form, **({"csrf": token} if token else {})},
                                             headers=headers))
        if token:
            headers["X-CSRF-Token"] = token
        headers["Accept"] = "application/json"
        return self._keep(self.http.post(path, json=json or {}, headers=headers))

    def enrol(self, link: str) -> httpx.Response:
        """Open the enrolment link and register this browser's passkey with it."""
        path = link.split("localhost", 1)[-1].split(":", 1)[-1]
        path = path[path.index("/"):]
        page = self.get(path)
        if page.status_code != 200:
            return page
        options = self.post(f"{path}/options")
        if options.status_code != 200:
            return options
        return self.post(f"{path}/finish", {"credential": self.device.create(options.json()["options"])})

    def sign_in(self) -> httpx.Response:
        self.get("/signin")
        options = self.post("/signin/options").json()["options"]
        return self.post("/signin/finish", {"credential": self.device.get(options)})

    def decision_options(self, release_id: str, decision: str, reason: str = "", risk_override: str = ""):
        self.get(f"/releases/{release_id}")
        return self.post(f"/releases/{release_id}/decision/options",
                         {"decision": decision, "reason": reason, "risk_override": risk_override})

    def decide(self, release_id: str, decision: str, reason: str = "", risk_override: str = "") -> httpx.Response:
        """The decision page's two requests: the options, then the passkey's assertion over them."""
        options = self.decision_options(release_id, decision, reason, risk_override)
        if options.status_code != 200:
            return options
        return self.post(f"/releases/{release_id}/decision",
                         {"credential": self.device.get(options.json()["options"])})


def enrolment_link(settings, name: str, role: str, **kwargs) -> str:
    """What `dprelease controller add NAME --passkey` prints (the link with its one-time token)."""
    from dprelease.store import Store, people

    store = Store(settings.store_url)
    store.create_all()
    return f"{settings.console_url}/enrol/{people.add_person(store, name, role, **kwargs)}"
