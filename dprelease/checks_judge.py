"""great-expectations as the judge of the checks' witness table, in this process or in a process
of its own started ahead.

great-expectations takes 1.5-3 s and about 300 MB to import (it pulls in scipy, altair and, where
installed, pyspark). A release command over an escrowed dataset (`worth_a_process`) starts the
judge process as soon as its request is known (`start_ahead`): the import then runs on the other
core beside the command's own imports, previews and flow start, and its memory leaves with the
process once the witness is judged, before the engine's compute, which is where a release's memory
peaks. A process Prefect started for one flow run (a worker's run) starts its judge when its checks
begin (`runs_one_flow_run`, pipeline.check_data): the import then runs beside the escrow's scan,
without the Spark and SciPy parts the run's own import pulled in (1.4 CPU-seconds less per run).
Without a judge started ahead (the Python API in the caller's own process, tests, a Spark witness,
which needs the caller's SparkSession) the suite runs here.

One judge per process, not per release: in a process that runs releases one after another (the
command line's app called from Python, a test session) the judge stays after its answer and judges
the next release's witness too, so great-expectations is imported once, not once per release
(1.4 CPU-seconds each, and each refused release's judge was killed mid-import). The `dprelease`
program runs one release and ends (`one_release_per_process`): its judge ends once it has answered,
and its memory leaves before the compute, as before.

The judge sees only the witness table (a few rows per column: minima, maxima, unexpected values)
and the expectations, never the dataset. Parent and child exchange pickles over the child's own
pipes (the same program on both ends); a judge that is gone or fails is replaced by judging here,
so its verdicts are always great-expectations' own.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import types
from dataclasses import dataclass, field

_LENGTH = struct.Struct("<Q")  # each message: its length, then its pickle


def worth_a_process(data_bytes: int | None) -> bool:
    """Whether a release's checks over this escrowed data get a judge process (None: not escrowed,
    e.g. an external dataset, whose Spark witness is judged beside its session). Always, whatever
    the size: with the checks judged from the escrow's footer, the import is most of their cost, and
    on 2 cores it is better spent beside the command than in it. 10k rows, shared Prefect server,
    alternating A/B, medians of 6: release 4.09 s judged here against 2.71 s with a judge (quiet),
    8.8 s against 6.1 s with two busy loops beside (medians of 4); with the command's own server
    (whose boot hides the import here) 5.67 s against 5.65 s. Large data gains memory too: the
    ~300 MB leave before the compute (10M rows, own server: 1.35 GB against 1.50 GB peak)."""
    return data_bytes is not None


@dataclass(frozen=True)
class Judgement:
    """One expectation's result, as `checks.validate` reads it from great-expectations."""

    success: bool
    result: dict = field(default_factory=dict)


def judge(witness, expectations: list[dict], spark=None) -> list[Judgement]:
    """great-expectations' result for each expectation on the witness, in the expectations' order:
    by the judge started ahead when there is one (and no Spark), else in this process. The judge is
    taken while it judges (another thread's witness meanwhile is judged here) and given back after
    its answer unless this process runs one release only."""
    if spark is None and (process := _take()) is not None:
        last = not _kept_between_releases
        try:
            verdicts = process.judge(witness, expectations, last=last)
        except JudgeUnavailable:
            _give_back(process, kept=False)  # judged here instead: same suite, same verdicts
        else:
            _give_back(process, kept=not last)
            return verdicts
    return run_suite(witness, expectations, spark)


class JudgeUnavailable(Exception):
    """The judge process ended or answered nothing usable."""


class JudgeProcess:
    """A child Python that imports great-expectations at once and judges witness tables, one per
    message, until its input closes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_judge_environment(),
                                        start_new_session=False)
        self.answered = False  # the child judged (not replaced by judging here)

    def judge(self, witness, expectations: list[dict], last: bool = True) -> list[Judgement]:
        """The verdicts on one witness; `last`: the child then ends (its input is closed at once),
        else it waits for the next witness. A child that fails to answer is ended either way."""
        kind, value = "error", "no answer"
        try:
            _send(self.process.stdin, (witness, expectations))
            if last:
                self.process.stdin.close()
            kind, value = _receive(self.process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, struct.error) as err:
            raise JudgeUnavailable(str(err)) from err
        finally:
            if last or kind != "ok":
                self.close(grace_s=5.0)
        if kind != "ok":
            raise JudgeUnavailable(value)
        self.answered = True
        return [Judgement(success, result) for success, result in value]

    def close(self, grace_s: float = 0.0) -> None:
        """End the child: its input is closed, and it ends by itself once it has answered what it
        was sent; after `grace_s` it is killed."""
        try:
            self.process.stdin.close()
        except OSError:  # unsent bytes to a child that is gone
            pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        try:
            self.process.stdout.close()
        except OSError:
            pass

    def forget_in_forked_child(self) -> None:
        """In a child forked without exec: close its copies of the pipes (the judge is the parent's;
        a copy of its input held open would keep it from seeing the parent's end)."""
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()  # nothing is buffered: each message is flushed as it is sent
            except (OSError, ValueError):
                pass


def _judge_environment() -> dict:
    """The judge's environment: this one without the keys (it sees a witness table, never the escrow,
    and signs nothing)."""
    return {k: v for k, v in os.environ.items() if k not in ("DPRELEASE_ESCROW_KEY", "DPRELEASE_CONTROLLER_KEY")}


_ahead: JudgeProcess | None = None  # the judge waiting for this process's next witness
_in_use: JudgeProcess | None = None  # the judge while it judges (taken out of _ahead)
_lock = threading.Lock()
#: whether the judge stays after its answer for the next release's witness (module docstring);
#: False in the `dprelease` program (one_release_per_process)
_kept_between_releases = True
_exit_handler_registered = False


def one_release_per_process() -> None:
    """This process runs one release and ends (the `dprelease` program): its judge ends once it has
    answered or is found not needed, so that its memory leaves before the engine's compute."""
    global _kept_between_releases
    _kept_between_releases = False


def start_ahead() -> None:
    """Start the judge process now (its import overlaps the caller's next seconds); the next
    `judge` without Spark uses it. Idempotent (a judge kept from an earlier release is used again,
    unless it has ended); the child is ended at this process's exit."""
    global _ahead, _exit_handler_registered
    with _lock:
        if _ahead is not None and _ahead.process.poll() is not None:  # ended (killed): replaced
            _ahead.close()
            _ahead = None
        if _ahead is None and _in_use is None:
            _ahead = JudgeProcess()
            if not _exit_handler_registered:
                atexit.register(discard)
                _exit_handler_registered = True


def _take() -> JudgeProcess | None:
    """The waiting judge, taken for one witness (None when there is none, or it is judging another)."""
    global _ahead, _in_use
    with _lock:
        process, _ahead = _ahead, None
        if process is not None:
            _in_use = process
        return process


def _give_back(process: JudgeProcess, kept: bool) -> None:
    """The judge is done with one witness: `kept`, it waits for the next (unless discarded meanwhile:
    then it is ended), else it has ended."""
    global _ahead, _in_use
    with _lock:
        kept = kept and _in_use is process and _ahead is None
        if _in_use is process:
            _in_use = None
        if kept:
            _ahead = process
    if not kept:
        process.close()


def _forget_after_fork() -> None:
    """A forked child neither uses nor holds its parent's judge."""
    global _ahead, _in_use, _lock
    _lock = threading.Lock()
    for process in (_ahead, _in_use):
        if process is not None:
            process.forget_in_forked_child()
    _ahead = _in_use = None


os.register_at_fork(after_in_child=_forget_after_fork)


def yield_cpu(niceness: int = 5) -> None:
    """Lower the judge process's CPU priority (`niceness` below its command's): something else its
    command waits for first (its own Prefect server's boot) gets the cores before the judge's import
    does. 10M-row release with the command's own server, A/B medians of 6: 7.14 -> 6.79 s."""
    if _ahead is not None and _ahead.process.poll() is None:
        try:
            lower = min(19, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
            os.setpriority(os.PRIO_PROCESS, _ahead.process.pid, lower)
        except (AttributeError, OSError):  # not on this platform, or the child just ended
            pass


def runs_one_flow_run() -> bool:
    """Whether this process was started to execute one Prefect flow run (`python -m prefect.engine`,
    as a worker or a deployment's runner starts it): its witness is then worth a judge process, as a
    `dprelease release` command's is (start_ahead), where the Python API in someone's own process
    judges in that process."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "prefect.engine"


def started() -> bool:
    """A judge process started ahead waits for the next witness."""
    return _ahead is not None


def not_needed() -> None:
    """The release at hand needs no judge (refused, or its witness is judged beside Spark): ended
    when this process runs one release only, else kept for the next release."""
    if not _kept_between_releases:
        discard()


def discard() -> None:
    """End the judge started ahead now (this process's exit; one release per process: nothing will
    use it)."""
    global _ahead, _in_use
    with _lock:
        process, _ahead = _ahead, None
        _in_use = None  # a judge judging now is ended when it gives itself back
    if process is not None:
        process.close(grace_s=0.0)


def run_suite(witness, expectations: list[dict], spark=None) -> list[Judgement]:
    """The suite on the witness table in this process (an ephemeral context: nothing written to
    disk); with a SparkSession, through great-expectations' Spark datasource."""
    import logging

    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_spark("dprelease") if spark is not None else context.data_sources.add_pandas("dprelease")
    batch = source.add_dataframe_asset("data").add_batch_definition_whole_dataframe("all")
    suite = gx.ExpectationSuite(name="dataset-checks")
    for e in expectations:
        suite.add_expectation_configuration(ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"]))
    suite = context.suites.add(suite)
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="checks", data=batch, suite=suite))
    frame = witness if spark is None else spark_witness(spark, witness)
    result = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
    pending = list(result.results)
    ordered = []
    for e in expectations:  # match each expectation to its result (type and column)
        target = (e["type"], e["kwargs"].get("column"))
        match = next(r for r in pending if (r.expectation_config.type, r.expectation_config.kwargs.get("column")) == target)
        pending.remove(match)
        ordered.append(Judgement(bool(match.success), {"observed_value": _plain(match.result.get("observed_value"))}))
    return ordered


class _DeferredModule(types.ModuleType):
    """Stands in for a module until one of its attributes is read, then loads the real one (and
    takes itself out of the way first, so that the module's own imports find no stand-in)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        parent, _, child = self.__name__.rpartition(".")
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        if parent and getattr(sys.modules.get(parent), child, None) is self:
            delattr(sys.modules[parent], child)
        return getattr(importlib.import_module(self.__name__), name)


def defer_module(name: str) -> None:
    """Put off loading module `name` until it is used. great-expectations imports scipy.stats
    (0.5 s) for one expectation (KL divergence) that the data checks never run at scale."""
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    stand_in = _DeferredModule(name)
    sys.modules[name] = stand_in
    if parent:
        setattr(importlib.import_module(parent), child, stand_in)


def load_framework() -> None:
    """Import great-expectations here (seconds), e.g. while a Prefect server starts."""
    import great_expectations  # noqa: F401
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration  # noqa: F401


def spark_witness(spark, witness):
    """The witness table as a Spark DataFrame (a few rows per column), every column as text or
    double so that a column holding only a NULL still has a type Spark accepts."""
    from decimal import Decimal

    import numpy as np
    import pandas as pd
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    fields, columns = [], {}
    for name in witness.columns:
        values = list(witness[name])
        present = [v for v in values if not pd.isna(v)]
        numeric = bool(present) and all(isinstance(v, (int, float, Decimal, np.integer, np.floating))
                                        and not isinstance(v, (bool, np.bool_)) for v in present)
        fields.append(StructField(name, DoubleType() if numeric else StringType(), True))
        columns[name] = [None if pd.isna(v) else (float(v) if numeric else str(v)) for v in values]
    rows = list(zip(*columns.values())) if columns else []
    return spark.createDataFrame(rows, StructType(fields))


def _plain(value):
    """An observed value as plain Python (numpy scalars and arrays become numbers and lists), so
    that it crosses the pipe and prints the same from either judge."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _send(pipe, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LENGTH.pack(len(data)) + data)
    pipe.flush()


def _receive(pipe):
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the judge process ended without an answer")
    (size,) = _LENGTH.unpack(head)
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the judge process's answer was cut short")
    return pickle.loads(data)  # noqa: S301 - our own child process, over its private pipe


#: what the judge's great-expectations never loads: the Spark and SQL datasources' libraries (a
#: witness is judged as a pandas frame). Its import, this machine, medians of 3: 1.42 s with both
#: present, 1.20 s without SQLAlchemy (pyspark was already out).
JUDGE_SKIPS = ("pyspark", "sqlalchemy")
#: what it loads only when an expectation uses it: scipy.stats (0.5 s) for the KL divergence, altair
#: (0.08 s) for charts the judge never renders
JUDGE_DEFERS = ("scipy.stats", "altair")


def _serve() -> None:
    """The child: import great-expectations, then judge each witness sent and answer it, until the
    input closes; then exit at once (the parent waits for the exit; a normal teardown with
    great-expectations loaded takes about 0.5 s). Interrupts are the parent's to handle (a Ctrl-C
    reaches the whole terminal's process group); a parent that ends closes our input, and we end too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")  # the answer's own channel: whatever a library prints
    os.dup2(2, 1)  # goes to standard error (the parent's DEVNULL), never into the answer
    sys.stdout = sys.stderr
    for backend in JUDGE_SKIPS:    # judged here: escrowed data only, as pandas; great-expectations
        sys.modules[backend] = None  # then skips its optional Spark and SQL parts (import: 0.2 s each)
    for module in JUDGE_DEFERS:    # and loads these only if an expectation uses them
        defer_module(module)
    load_framework()
    while True:
        try:
            witness, expectations = _receive(sys.stdin.buffer)
        except EOFError:
            break
        try:
            answer = ("ok", [(j.success, j.result) for j in run_suite(witness, expectations)])
        except Exception as err:  # noqa: BLE001 - the parent judges again in its own process
            answer = ("error", f"{type(err).__name__}: {err}")
        _send(answers, answer)
    answers.close()
    os._exit(0)  # nothing is left to save, and tearing great-expectations down takes 0.5 s


if __name__ == "__main__":
    _serve()
