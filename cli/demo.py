"""`make demo` / `dprelease demo`: the whole release path on the embedded Adult data.

A fresh home in ./demo-output (never your DPRELEASE_HOME, store, keys or Prefect server), a
temporary Prefect server, the Adult file encrypted into the escrow, one release whose epsilon the
platform chooses (the risk model), the controller summary, the approval (a prompt; without a terminal it approves and says so), the
signed analyst report written and verified, and the paths printed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

#: the embedded Adult data: inside the installed package (the wheel maps examples/data to
#: dprelease.cli.demo_data), or in the checkout's examples/data
_INSTALLED_DATA = Path(__file__).resolve().with_name("demo_data") / "adult.csv.gz"
DATA = _INSTALLED_DATA if _INSTALLED_DATA.is_file() else Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
SQL = """SELECT WITH ANONYMIZATION education,
       ANON_COUNT(*, 1) AS people,
       ANON_AVG(age, 17, 90) AS average_age,
       ANON_AVG(hours_per_week, 1, 99) AS weekly_hours
FROM adult
GROUP BY education"""
#: how long the demo waits for its temporary Prefect server to answer /health
DEMO_SERVER_STARTUP_TIMEOUT_S = 180

#: the demo's release request: epsilon from the risk model, the smallest total epsilon at which the
#: count of people per education level is within +-10 at 90%, each average within +-6 years and
#: +-8 hours for a group of 100, and a group of 100 people is released with probability 0.9, the
#: budget split by what each needs (split: need; the equal split needs 40% more epsilon, above what
#: the risk allows). The attacker's target: a person's education, 16 levels; a changed value: m = 2
REQUEST = {
    "dataset": "adult", "title": "Age and working hours by education (UCI Adult)", "sql": SQL,
    "epsilon": {"risk": {"trust": "low", "sensitivity": "high", "max_risk": 0.2,
                         "max_noise": {"people": 10, "average_age": 6, "weekly_hours": 8},
                         "groups": {"units": 100, "probability": 0.9}, "split": "need", "n": 16, "m": 2}},
    "delta": 1e-6, "requested_by": "analyst@example.org",
}


#: the file that marks a folder as the demo's own home: only such a folder is ever deleted
DEMO_MARKER = ".dprelease-demo"
#: the settings of yours the demo keeps: where this installation's empty Prefect database is kept
#: (copied, never changed), and the test-only pause points (dprelease/faults.py). Every other DPRELEASE_* points at your home, store, keys, escrow,
#: archive or console, which the demo must neither read nor change
KEPT_SETTINGS = ("DPRELEASE_PREFECT_TEMPLATE_DIR", "DPRELEASE_TEST_PAUSE_AT", "DPRELEASE_TEST_PAUSE_MARKER")
#: the Prefect settings that would send the demo's run to your Prefect server
PREFECT_CONNECTION = ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_API_KEY", "PREFECT_PROFILES_PATH")


class DemoHomeTaken(ValueError):
    """./demo-output exists and is not a demo's home: the demo refuses rather than delete it."""


def demo_home() -> Path:
    """Where the demo keeps everything: ./demo-output, whatever DPRELEASE_HOME says (that is your home)."""
    return (Path.cwd() / "demo-output").resolve()


#: the open directory whose lock says a demo runs there (held until this process ends)
_HELD: list[int] = []


def _hold_the_directory(directory: Path) -> None:
    """One demo at a time in a directory: each deletes ./demo-output as it starts, so a second one
    would pull the first's store, keys and escrow from under it. The lock is on the directory itself
    (no file left behind) and the kernel drops it when the process ends, by kill -9 too."""
    held = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(held)
        raise DemoHomeTaken(f"another `dprelease demo` is running in {directory}: wait for it to end, or run this one "
                            "from another directory") from None
    _HELD.append(held)


def _clear_previous_demo(home: Path) -> None:
    """Delete the previous demo's home (it holds the marker); refuse a folder that is not one."""
    if (home / DEMO_MARKER).is_file():
        shutil.rmtree(home)
    elif home.exists() and any(home.iterdir()):
        raise DemoHomeTaken(f"{home} exists and is not a previous demo's home (no {DEMO_MARKER} in it): the demo "
                            "writes there and deletes it on its next run; move it away or run the demo from "
                            "another directory")


def prepare_environment() -> Path:
    """A fresh demo home in ./demo-output, with none of your settings (your DPRELEASE_HOME, store, keys,
    escrow and Prefect server are left alone) and Prefect kept inside it (analytics off). Returns the home."""
    home = demo_home()
    _hold_the_directory(home.parent)
    _clear_previous_demo(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / DEMO_MARKER).write_text("made by `dprelease demo`: deleted by its next run\n")
    for name in [name for name in os.environ if name.startswith("DPRELEASE_") and name not in KEPT_SETTINGS]:
        del os.environ[name]
    for name in PREFECT_CONNECTION:
        os.environ.pop(name, None)
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_HOME"] = str(home / "prefect")
    # one command shows the whole path: its Prefect server ends with it (nothing left running, and
    # the next demo, which deletes this home, never pulls a database from under a live server)
    os.environ["DPRELEASE_PREFECT_SERVER"] = "temporary"
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # Prefect polls its temporary server's /health until it answers; its default patience (20 s of
    # polling) is too short on a loaded machine, where the first start can take longer
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(DEMO_SERVER_STARTUP_TIMEOUT_S))
    return home


def run_demo(console) -> dict:
    prepare_environment()
    from dprelease import admin
    from dprelease.reporting import signing
    from dprelease.requests import parse_request
    from dprelease.settings import Settings

    from .interactive import run_release_interactively

    settings = Settings.from_env()
    console.rule("dprelease demo")
    for line in admin.init(settings):
        console.print(f"  {line}")
    from dprelease import decisions

    controller_key = settings.key_dir / "controllers" / "demo.pem"
    fingerprint = decisions.create_controller(settings, "demo", controller_key)
    console.print(f"  controller 'demo' registered (key {fingerprint}); decisions are signed with {controller_key}")
    ds = admin.register_dataset(settings, "adult", DATA, "person_id", epsilon_cap=5.0, delta_cap=1e-5, add_row_id=True)
    console.print(f"  dataset 'adult' encrypted into the escrow ({ds.fingerprint[:16]}...); epsilon cap 5")
    request = parse_request(REQUEST)
    console.print("  request: epsilon chosen by the risk model for the whole plan (trust low, sensitivity high, "
                  "tolerable risk 0.2; with 90% probability the count of people within +-10 of the truth, the "
                  "averages within +-6 years and +-8 hours for a group of 100, a group of 100 released; the budget "
                  "split by what each needs)")
    console.rule("controller summary")
    result = run_release_interactively(settings, request, approve_as=None, timeout=600, no_terminal_reviewer="demo",
                                       controller_key=controller_key)
    console.rule("result")
    if result.get("status") != "published":
        console.print(f"release {result['release_id']}: {result['status']} (nothing published)")
        return result
    directory = Path(result["directory"])
    report = signing.verify_directory(directory, settings.public_key_file)
    console.print(f"published: {directory / 'index.html'}")
    console.print(f"data files: {directory / 'results.csv'}, {directory / 'results.json'}")
    console.print(f"publication index: {settings.publication_dir / 'index.html'}")
    console.print(f"controller report (archive, not published): "
                  f"{settings.archive_dir / result['release_id'] / 'controller' / 'controller.html'}")
    console.print(f"verify: {'OK, signature and every file intact' if report.ok else report}")
    console.print(f"publisher's key fingerprint: {signing.key_fingerprint(settings.public_key_file)}")
    console.print(f"run again with: dprelease verify {directory} --key {settings.public_key_file}")
    return result
