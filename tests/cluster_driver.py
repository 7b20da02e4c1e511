"""One release as a driver on a Spark cluster (tests/test_spark_cluster.py runs it in its own
process, so its memory is its own): `python cluster_driver.py URL UI_URL FOLDER...`, URL either
spark://... (a classic driver: this process and the JVM it starts; UI_URL unused) or sc://... (a
Spark Connect client, this process only; UI_URL the server's). Prints one JSON line: the
application's id, its executors as the driver's REST API reports them, the command names of this
process's children, and for each folder's release the released partitions, the peak resident
memory (VmHWM) of this process and, classic, of its driver JVM and the bytes its tasks sent the driver."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from spark_cluster import executors, free_port, task_result_bytes  # noqa: E402
from spark_session import executor_conf  # noqa: E402

CU, ROW_BOUND, SUM_BOUND = 4, 10, 1000


def peak_rss(pid: int | str = "self") -> int:
    """The peak resident set (VmHWM) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def child_commands() -> list[str]:
    """The command names of this process's children (a classic driver starts a JVM; a client none)."""
    me, names = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if entry.name.isdigit() and stat.rsplit(")", 1)[1].split()[1] == me:
            names.append(stat.split("(", 1)[1].rsplit(")", 1)[0])
    return names


def session(url: str):
    from pyspark.sql import SparkSession

    if url.startswith("sc://"):  # as the platform makes it: DPRELEASE_SPARK_MASTER=sc://...
        from dprelease.external import spark_session
        from dprelease.settings import Settings

        return spark_session(Settings.from_env({"DPRELEASE_SPARK_MASTER": url}))
    builder = SparkSession.builder
    for key, value in executor_conf().items():  # the suite's quick JVMs (tests/spark_session.py)
        builder = builder.config(key, value)
    return (builder.master(url).appName("dprelease-cluster-test")
            .config("spark.driver.memory", "512m").config("spark.executor.memory", "512m")
            .config("spark.sql.shuffle.partitions", "4").config("spark.ui.port", str(free_port()))
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")  # both executors before the first task
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "600s")
            .config("spark.executor.processTreeMetrics.enabled", "true").getOrCreate())


def main(url: str, ui_url: str, *folders: str) -> None:
    """A release of each folder in turn; after each, the peaks so far (VmHWM only grows, so a
    later, larger release that needed more memory shows as a higher figure) and the bytes its
    tasks sent the driver."""
    import dp_core as dp

    spark = session(url)
    query = dp.Query([dp.count(upper=ROW_BOUND), dp.sum_("val", 0, SUM_BOUND)], privacy_unit="uid",
                     group_by=("part",), epsilon=1.0, delta=1e-6, max_partitions_contributed=CU)
    app_id = spark.conf.get("spark.app.id")
    classic = url.startswith("spark://")
    ui_url = spark.sparkContext.uiWebUrl if classic else ui_url  # Connect: the server is the driver
    releases, sent = [], 0
    for folder in folders:
        result = dp.execute(query, spark.read.parquet(folder), backend="spark", spark=spark)
        out = {"released": len(result.table), "python_peak": peak_rss()}
        if classic:
            total = task_result_bytes(ui_url, app_id)
            out.update(result_bytes=total - sent, jvm_peak=peak_rss(spark.sparkContext._gateway.proc.pid))
            sent = total
        releases.append(out)
    report = {"app_id": app_id, "releases": releases, "executors": executors(ui_url, app_id),
              "children": child_commands()}
    spark.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
