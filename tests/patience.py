"""How long a test waits for what an idle machine does in seconds (a server's boot, a run's pause,
a process's exit): a limit only a hung process reaches, never a measure of speed. CI must pass with
the machine at load 10 on 2 cores, where a step takes tens of times its idle time (a Prefect
server's first answer took over 10 s at load 5-10), so no test waits less than this for anything."""

PATIENCE_S = 900.0
