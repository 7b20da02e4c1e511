"""A Spark standalone cluster (a master and its workers) and a Spark Connect server on 127.0.0.1,
started from the pyspark wheel's own jars: no Spark download, each piece a JVM process of its own.

Each command line is built by Spark's launcher (org.apache.spark.launcher.Main, as bin/spark-class
does: the classpath and the JVM's module options) and the JVM is then started directly, so the PID
held here is the JVM's own and stopping is a signal to that PID. The tests (tests/test_spark_cluster.py)
and the benchmark (bench/engine_spark.py --cluster) use it; docs/deployment.md says how a real
deployment starts the same classes on its hosts.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

#: the launcher's scala version; a wheel has no build tree to read it from (launcher: getScalaVersion)
SCALA_VERSION = "2.13"
#: a bound on waiting for a piece to come up, not a timing: ends as soon as it is up
START_LIMIT_S = 600


def spark_home() -> Path:
    """The pyspark package folder: its jars/ is a Spark distribution's."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict | None = None) -> dict:
    """The environment of a Spark JVM: the wheel as SPARK_HOME, everything bound to 127.0.0.1."""
    return dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_SCALA_VERSION=SCALA_VERSION,
                SPARK_LOCAL_IP="127.0.0.1", **(extra or {}))


def java_command(main_class: str, args: list[str], env: dict) -> list[str]:
    """The java command line Spark's launcher builds for `main_class args` (NUL-separated output)."""
    jars = str(spark_home() / "jars" / "*")
    out = subprocess.run(["java", "-cp", jars, "org.apache.spark.launcher.Main", main_class, *args],
                         env=env, check=True, capture_output=True).stdout
    command = [part.decode() for part in out.split(b"\0") if part.strip()]
    return [command[0].strip(), *command[1:]]  # the launcher writes a newline before the java path


def _start(main_class: str, args: list[str], log: Path, env: dict) -> subprocess.Popen:
    with open(log, "wb") as handle:
        return subprocess.Popen(java_command(main_class, args, env), stdout=handle, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def _wait(what: str, ready, procs: list[subprocess.Popen], log: Path) -> None:
    """Poll `ready()` until it is true; a process that exits first or the limit is a RuntimeError."""
    deadline = time.monotonic() + START_LIMIT_S
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not start; its log ends:\n{tail}")
        time.sleep(0.5)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM to the JVM's PID (its shutdown hooks stop its children), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Cluster:
    """A running standalone cluster: its master's URL, its UI (JSON at /json/) and its processes."""

    master_url: str
    ui_url: str
    root: Path
    master: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)

    def state(self) -> dict:
        return get_json(f"{self.ui_url}/json/")

    def worker_dirs(self) -> list[Path]:
        """Each worker's own working directory (executors' folders are app-ID/EXECUTOR-ID in it)."""
        return [self.root / f"worker-{i}" for i in range(len(self.workers))]

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            stop_process(proc)


def start_cluster(root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> Cluster:
    """A master and `workers` workers (each `cores` cores and `memory`), returned once every worker
    has registered with the master. Daemons get 256 MB heaps; the master's REST submission server
    (a fixed port) is off."""
    root.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    env = _env({"SPARK_DAEMON_MEMORY": "256m", "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
    master = _start("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
                    root / "master.log", env)
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", root, master)
    try:
        _wait("the Spark master", lambda: cluster.state()["status"] == "ALIVE", [master], root / "master.log")
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            cluster.workers.append(_start(
                "org.apache.spark.deploy.worker.Worker",
                [cluster.master_url, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                 "--cores", str(cores), "--memory", memory, "--work-dir", str(work)],
                root / f"worker-{i}.log", env))
        _wait(f"{workers} Spark workers", lambda: cluster.state()["aliveworkers"] == workers,
              [master, *cluster.workers], root / "master.log")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@dataclass
class ConnectServer:
    """A Spark Connect server (a driver on the cluster that clients reach at `url`)."""

    url: str  # sc://localhost:PORT/;token=... (localhost: a token over a local channel, no TLS)
    ui_url: str
    proc: subprocess.Popen

    def stop(self) -> None:
        stop_process(self.proc)


def start_connect_server(cluster: Cluster, executor_memory: str = "512m", driver_memory: str = "512m",
                         conf: dict | None = None) -> ConnectServer:
    """A Spark Connect server whose executors run on `cluster`, bound to 127.0.0.1 and guarded by
    a random token (SPARK_CONNECT_AUTHENTICATE_TOKEN); returned once it accepts connections."""
    port, ui_port, token = free_port(), free_port(), secrets.token_hex(16)
    settings = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port),
                "spark.ui.port": str(ui_port), "spark.executor.memory": executor_memory,
                "spark.executor.processTreeMetrics.enabled": "true", **(conf or {})}
    args = ["--master", cluster.master_url, "--driver-memory", driver_memory,
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    log = cluster.root / "connect.log"
    proc = _start("org.apache.spark.deploy.SparkSubmit", [*args, "spark-internal"], log,
                  _env({"SPARK_CONNECT_AUTHENTICATE_TOKEN": token}))

    def listening() -> bool:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return True

    try:
        _wait("the Spark Connect server", listening, [proc], log)
    except BaseException:
        stop_process(proc)
        raise
    return ConnectServer(f"sc://localhost:{port}/;token={token}", f"http://127.0.0.1:{ui_port}", proc)


def executors(ui_url: str, app_id: str) -> list[dict]:
    """The application's executors as its driver's REST API reports them (the driver's is id 'driver')."""
    return get_json(f"{ui_url}/api/v1/applications/{app_id}/allexecutors")


def task_result_bytes(ui_url: str, app_id: str) -> int:
    """The bytes the application's tasks sent to its driver as results (each task's resultSize,
    every stage): what a plan that collected data-sized rows would make grow with the data."""
    stages = get_json(f"{ui_url}/api/v1/applications/{app_id}/stages?details=true")
    return sum(task.get("taskMetrics", {}).get("resultSize", 0)
               for stage in stages for task in (stage.get("tasks") or {}).values())
