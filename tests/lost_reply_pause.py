"""A pause whose reply was lost still ends in the submitted answer (tests/test_release_flow.py runs
this in a process of its own, with a Prefect API of its own): `python tests/lost_reply_pause.py
state schema state,schema,description` runs one paused flow per argument, each losing the replies it names
once (to the Paused state, to saving the form or its description), resumes it and prints what it returned, one line
per flow. The cases share one process and one Prefect API (each its own flow run)."""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx
from prefect import flow
from prefect.flow_runs import resume_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from prefect_harness import prefect_harness

from dprelease.flows.approvals import wait_until_paused
from dprelease.flows.pausing import pause_for_input

PATIENCE_S = 15 * 60  # tests/patience.py: a limit only a hung process reaches


class Answer(RunInput):
    word: str


DESCRIPTION = "The summary the controller decides on."


def dialog(run_id: str) -> str:
    """The description the run's Resume dialog shows above its form."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        keyset = client.read_flow_run(run_id).state.state_details.run_input_keyset
        return json.loads(client.read_flow_run_input(run_id, keyset["description"]))


def lose_replies_once(losing: dict) -> None:
    """Patch this process's HTTP client: the first reply of each kind in `losing["lose"]` is lost
    after the server committed the request (appended to `losing["lost"]`)."""
    real_send = httpx.Client.send

    def send_losing_the_pause_reply(self, request, *args, **kwargs):
        response = real_send(self, request, *args, **kwargs)
        path = request.url.path
        saving = path.endswith("/input") and request.method == "POST"
        which = ("state" if path.endswith("/set_state") and b'"PAUSED"' in request.content else
                 "schema" if saving and b'-schema"' in request.content else
                 "description" if saving and b'-description"' in request.content else None)
        if which in losing["lose"] and which not in losing["lost"]:
            losing["lost"].append(which)  # the server committed it; the reply never arrives
            raise httpx.ReadTimeout("reply lost", request=request)
        return response

    httpx.Client.send = send_losing_the_pause_reply


def pause_losing(lose: tuple[str, ...], losing: dict) -> None:
    """One paused flow whose replies named in `lose` are lost once each, resumed with an answer."""
    losing.update(lose=lose, lost=[])
    lost = losing["lost"]
    box: dict = {}

    @flow
    def asks() -> str:
        box["run_id"] = str(flow_run.id)
        return pause_for_input(Answer.with_initial_data(description=DESCRIPTION), timeout=PATIENCE_S,
                               poll_interval=0.2, key="asked").word

    thread = threading.Thread(target=lambda: box.update(state=asks(return_state=True)), daemon=True)
    thread.start()
    deadline = time.monotonic() + PATIENCE_S
    while "run_id" not in box and time.monotonic() < deadline:
        time.sleep(0.1)
    while True:  # the pause, while the flow lives (a flow that failed to pause has ended: say so at once)
        assert thread.is_alive(), f"the flow ended without pausing: {box.get('state')}"
        try:
            wait_until_paused(box["run_id"], timeout=5)
            break
        except TimeoutError:
            continue
    assert dialog(box["run_id"]) == DESCRIPTION, "the Resume dialog would show no controller summary"
    resume_flow_run(box["run_id"], run_input={"word": "approved"})
    thread.join(PATIENCE_S)
    assert "state" in box, "the flow did not end after the answer"
    assert sorted(lost) == sorted(lose), f"the fault was not injected: the test proves nothing ({lost})"
    assert box["state"].is_completed(), box["state"]
    print(f"{box['state'].result()} after losing {sorted(lost)}")


if __name__ == "__main__":
    losing: dict = {"lose": (), "lost": []}
    lose_replies_once(losing)
    with prefect_harness():
        for case in sys.argv[1:]:
            pause_losing(tuple(case.split(",")), losing)
