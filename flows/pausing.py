"""Pausing a flow run for a typed answer, robust to the API client's own retries.

`prefect.flow_runs.pause_flow_run` proposes the Paused state once through an HTTP client that
retries a request whose reply it did not get. When the server committed the first request (a
busy SQLite-backed server answers slowly), the retry carries the same transition id and the
server refuses it as a duplicate ("This run has already made this state transition"), returning
the Paused state that the first request set. Prefect 3.8 then raises `Pause` although the run is
paused exactly as asked. `pause_for_input` recognises that reply by its pause key and finishes the
pause the way Prefect would have: the form's schema saved under the state's keyset, then a wait
for the run to be resumed, then the submitted input. The next request, saving the form's schema,
can lose its reply the same way: its retry is refused with 409 Conflict (the schema is there), and
the pause goes on the same way. Saving the form's description (what the Resume dialog shows above
the form) is the third request: Prefect's `RunInput.save` stops at the schema's 409 and never saves
it, so the pause saves each part that is not there yet (`_save_form`).
"""

from __future__ import annotations

import time

from prefect import get_client, get_run_logger
from prefect.exceptions import FlowPauseTimeout, Pause, PrefectHTTPStatusError
from prefect.flow_runs import pause_flow_run
from prefect.input.run_input import keyset_from_base_key, run_input_subclass_from_type
from prefect.runtime import flow_run


def pause_for_input(form, *, timeout: int, poll_interval: float, key: str):
    """The input a controller submitted to resume this run (`form`, a RunInput type), waiting at
    most `timeout` seconds; FlowPauseTimeout when nobody resumed it in time."""
    try:
        return pause_flow_run(wait_for_input=form, timeout=timeout, poll_interval=poll_interval, key=key)
    except Pause as signal:
        if not _paused_by(signal.state, key):
            raise
        lost = "the pause"
    except PrefectHTTPStatusError as err:
        if not _input_already_saved(err):  # the form or its description, saved by pause_flow_run after our pause was set
            raise
        lost = "the form"
    get_run_logger().info("paused (the server had saved %s before the client's retry)", lost)
    return _finish_pause(form, key, timeout, poll_interval)


def _paused_by(state, key: str) -> bool:
    return state is not None and state.is_paused() and state.state_details.pause_key == key


def _input_already_saved(err: PrefectHTTPStatusError) -> bool:
    """A 409 Conflict on saving a run input (the form or its description): a retry found what the lost
    request had saved."""
    return err.response.status_code == 409 and err.request.method == "POST" and err.request.url.path.endswith("/input")


def _save_form(typed_form, keyset) -> None:
    """The form's schema, then its description, each unless a request whose reply was lost saved it."""
    from prefect.input.actions import create_flow_run_input

    try:
        typed_form.save(keyset)
        return
    except PrefectHTTPStatusError as err:
        if not _input_already_saved(err):
            raise
    description = getattr(typed_form, "_description", None)
    if isinstance(description, str) and description:
        try:
            create_flow_run_input(key=keyset["description"], value=description)
        except PrefectHTTPStatusError as err:
            if not _input_already_saved(err):
                raise


def _finish_pause(form, key: str, timeout: int, poll_interval: float):
    """What pause_flow_run does once the Paused state is set: publish the form (unless it is there
    already), wait for Running (the controller may have resumed the run meanwhile), load the input."""
    keyset = keyset_from_base_key(f"paused-{key}")  # as Prefect names a Paused state's inputs
    typed_form = run_input_subclass_from_type(form)
    _save_form(typed_form, keyset)
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            current = client.read_flow_run(flow_run.id).state
            if current is not None and current.is_running():
                return typed_form.load(keyset)
            if time.monotonic() >= deadline:
                raise FlowPauseTimeout("Flow run was paused and never resumed.")
            time.sleep(poll_interval)
