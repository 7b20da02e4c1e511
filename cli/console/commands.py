"""The console's commands: `dprelease console` (serve it), `dprelease analyst add|list` (`analyst
key` is registered beside `controller add`, in cli/app.py), and the one-time enrolment link
`controller add NAME --passkey` prints. Kept here, beside the console, so
that cli/app.py only registers them."""

from __future__ import annotations

import typer

from dprelease.settings import Settings

from ..errors import fail
from ..interactive import console as terminal

analyst_app = typer.Typer(help="Analysts: who may submit requests and read reports in the console.",
                          no_args_is_help=True)


def people_rows(table, role: str) -> None:
    """The console's people of a role in a listing: their passkeys (or a link not used yet)."""
    from dprelease.store import Store, people

    store = Store(Settings.from_env().store_url)
    store.create_all()
    for person in people.list_people(store):
        if person.role == role:
            count = len(people.passkeys_of(store, person.name))
            table.add_row(person.name, f"{count} passkey(s)" if count else "passkey not registered yet",
                          str(person.added_at)[:19])


def enrolment_link(name: str, role: str) -> None:
    """Register a console user and print their one-time enrolment link (it expires)."""
    from dprelease.store import Store, people

    settings = Settings.from_env()
    store = Store(settings.store_url)
    store.create_all()
    try:
        token = people.add_person(store, name, role)
    except people.ConsoleRefused as err:
        fail(str(err))
    hours = people.ENROLMENT_TTL.total_seconds() / 3600
    terminal.print(f"{role} {name!r}: give them this one-time link (it expires in {hours:g} h; it registers a "
                   f"passkey on their own device):\n{settings.console_url}/enrol/{token}", highlight=False,
                   soft_wrap=True)


@analyst_app.command("add")
def analyst_add(name: str, passkey: bool = typer.Option(True, "--passkey", help="print a one-time link with which "
                                                          "they register a passkey for the console")) -> None:
    """Register an analyst for the console: they submit requests there and read published reports.

    Example: dprelease analyst add ana --passkey"""
    enrolment_link(name, "analyst")


@analyst_app.command("list")
def analyst_list() -> None:
    """The analysts registered for the console and their passkeys, and those with a command-line key
    (`dprelease analyst key`) and its fingerprint."""
    from dprelease.reporting import signing
    from dprelease.store import Store, analysts

    from ..tables import Table

    table = Table("name", "passkeys or key", "added", whole=("name", "passkeys or key"))
    people_rows(table, "analyst")
    store = Store(Settings.from_env().store_url)  # people_rows created its tables
    for registered in analysts.keys(store):
        table.add_row(registered.name, f"key {signing.key_fingerprint(registered.public_key_pem.encode())}",
                      str(registered.added_at)[:19])
    table.print(terminal)


def console(port: int = typer.Option(8400, help="port to listen on"),
            host: str = typer.Option("127.0.0.1", help="address to listen on (beyond this machine: behind a TLS "
                                     "reverse proxy, see the controller guide)"),
            origin: str = typer.Option(None, envvar="DPRELEASE_CONSOLE_URL", help="the console's address as "
                                       "browsers reach it (default http://localhost:PORT)"),
            rp_id: str = typer.Option(None, help="the passkeys' relying party id (default: the origin's host)")
            ) -> None:
    """The controllers' and analysts' console in the browser: sign in with a passkey, decide paused
    releases, follow budgets; analysts submit requests and read published reports.

    Example: dprelease console --port 8400"""
    from dprelease.store import Store

    from .. import prefect_server
    from .server import relying_party, serve

    try:
        rp = relying_party(port, rp_id, origin)
    except ValueError as err:
        fail(str(err))
    try:
        prefect_server.check_mode()
    except ValueError as err:
        fail(str(err))
    Store(Settings.from_env().store_url)  # a home with no store is refused before a Prefect server starts
    prefect_server.start()
    prefect_server.wait_ready()
    terminal.print(f"the console: {rp.origin} (listening on {host}:{port}; Ctrl-C stops it)", highlight=False,
                   soft_wrap=True)
    serve(Settings.from_env(), host, port, rp)
