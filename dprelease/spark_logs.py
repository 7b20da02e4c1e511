"""Spark's own logs off in the Spark sessions the platform starts: they quote the data.

A statement that fails on a value (a text cast to a number under ANSI mode) is refused by the
engine in one line that never quotes the value (dp_core.engine_errors), but Spark prints it by
itself: the driver JVM's log4j2 loggers (Executor's "Exception in task", TaskSetManager's "Lost
task": `[CAST_INVALID_INPUT] The value '...' of the type "STRING" ...`, with the stack) and
pyspark's query-context loggers (`SQLQueryContextLogger`, a JSON line on stderr of their own
handler, classic and Spark Connect alike). Stderr is a terminal, a worker's journal, a log file an
operator or an analyst reads: a route from raw data around the controller's approval.

For a session the platform starts (dprelease.external.spark_session), unless DPRELEASE_SPARK_LOGS=on:
- the driver JVM's stderr is a pipe this process drains, keeping its last lines in memory only:
  its startup lines (the JVM's incubator-module warning, log4j's profile, hostname warnings)
  never reach the terminal, and when the JVM does not start, its last line is the reason the one
  line gives (no Java, a JAVA_HOME without one);
- once it runs, its log4j2 root logger is OFF (SparkContext.setLogLevel), so no appender of the
  JVM's logging (the console, or a file an operator configured) receives a line of the driver's,
  executors' included under local[N];
- pyspark's query-context loggers are raised above the ERROR they log at.
A Spark Connect client starts no JVM: only the last applies (the server's log is its operator's).
A session the user made (the process's active session, or one handed in) keeps its user's
logging. DPRELEASE_SPARK_LOGS=on (what `dprelease --debug` sets) leaves all of it as Spark does it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import deque

#: pyspark's loggers that print a failing statement's message (the value it failed on) on stderr,
#: through a handler of their own (pyspark.errors.exceptions.base.PySparkException._log_exception)
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
#: lines of the JVM's stderr kept, for the reason of a JVM that did not start
TAIL_LINES = 20
#: a line of the JVM's stderr that says why it did not start: its log's ERROR (Spark's default
#: layout, `yy/MM/dd HH:mm:ss ERROR Class: message`), or a launcher's or Java's words
LOGGED_ERROR = re.compile(r" ERROR \S+: (.+)")
FAILURE_WORDS = re.compile(r"error|exception|not set|no such file|not found|cannot|could not", re.IGNORECASE)


class JvmStderr:
    """The driver JVM's stderr: a pipe drained by a daemon thread (the JVM never blocks on a full
    pipe), its last TAIL_LINES lines kept in memory, never written anywhere."""

    def __init__(self) -> None:
        read_end, self.write_end = os.pipe()
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._reader = threading.Thread(target=self._drain, args=(read_end,), name="spark-jvm-stderr", daemon=True)
        self._reader.start()

    def _drain(self, read_end: int) -> None:
        with open(read_end, "rb") as pipe:
            for raw in pipe:
                self.lines.append(raw.decode(errors="replace").strip())

    def launched(self) -> None:
        """The JVM holds the write end now: this process closes its own (the pipe ends with the JVM)."""
        os.close(self.write_end)

    def reason(self, exited: bool) -> str | None:
        """Why the JVM did not start, from the lines it wrote: its log's last ERROR (a master that
        never answered: "All masters are unresponsive! Giving up."), else the first line that says a
        failure (the launcher's "JAVA_HOME is not set", "...bin/java: No such file or directory",
        Java's "Error: ..."), else its last line. `exited`: the JVM is gone, so its exit closed the
        pipe and every line it wrote is read first; a JVM still running is read as far as it is."""
        if exited:
            self._reader.join()
        said = [line for line in list(self.lines) if line]
        logged = [m.group(1) for m in map(LOGGED_ERROR.search, said) if m]
        failures = [line for line in said if FAILURE_WORDS.search(line)]
        return logged[-1] if logged else failures[0] if failures else said[-1] if said else None


def quiet_query_context_loggers() -> None:
    """pyspark's query-context loggers print nothing (they log at ERROR). Made as pyspark makes them
    (PySparkLogger.getLogger), since pyspark calls them with keywords a plain Logger refuses."""
    from pyspark.logger import PySparkLogger

    for name in QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


class JvmDidNotStart(Exception):
    """A driver JVM, or its SparkContext, that did not start: pyspark's error in its first line,
    with the JVM's reason (JvmStderr.reason)."""

    def __init__(self, error: Exception, said: str | None) -> None:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        super().__init__(f"{first} ({said})" if said else first)


def start_driver(conf):
    """A SparkSession on `conf` (a pyspark SparkConf) whose driver JVM prints nothing: started here
    with its stderr drained (JvmStderr) when this process has no JVM of pyspark's yet, its log4j2
    root logger OFF once it runs. A JVM that does not start raises JvmDidNotStart."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.config(conf=conf)
    if SparkContext._gateway is not None:  # pyspark's one JVM per process runs already (not ours: as it is)
        session = builder.getOrCreate()
    else:
        session = _started_here(conf)
    session.sparkContext.setLogLevel("OFF")
    quiet_query_context_loggers()
    return session


def _started_here(conf):
    """The driver JVM started with its stderr drained, then its SparkContext and session; a failure
    of either is JvmDidNotStart with the JVM's reason (its stderr is nobody's to read otherwise)."""
    from py4j.protocol import Py4JError
    from pyspark import SparkContext
    from pyspark.errors import PySparkException
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    stderr, gateway = JvmStderr(), None
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": stderr.write_end})
    except PySparkException as err:  # JAVA_GATEWAY_EXITED: the launcher or the JVM said why on stderr
        failure = err
    finally:
        stderr.launched()
    if gateway is None:
        raise JvmDidNotStart(failure, stderr.reason(exited=True))
    try:
        SparkContext(conf=conf, gateway=gateway)
        return SparkSession.builder.getOrCreate()  # the context holds the conf
    except (PySparkException, Py4JError) as err:  # e.g. a master that never answered: its context stopped
        raise JvmDidNotStart(err, stderr.reason(exited=False)) from None
