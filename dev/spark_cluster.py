"""A real Spark standalone cluster on loopback, and a worker Python like a shared cluster's.

``SparkStandalone`` starts a master and workers from the installed pyspark
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) on free ports and
waits until the master counts the workers alive. ``executor_python`` makes a virtualenv that has
pyspark's own dependencies (pandas, pyarrow, numpy and theirs) and nothing of this project or its
other dependencies (no pydantic, no PyYAML), as the Python on a team's shared cluster would be:
the tuning job must ship what its workers import (analytics.shipping).

Tests and ``bench/tune_scale.py`` use both; ``python -m dev.spark_cluster`` starts a cluster and
prints its master URL until interrupted.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from dev.harness import free_port
from dev.waiting import wait_until

# pyspark's SQL dependencies (and theirs): what a cluster that runs pandas UDFs has installed.
EXECUTOR_DISTRIBUTIONS = ("pandas", "numpy", "pyarrow")


def spark_home() -> Path:
    """The installed pyspark package: it carries Spark's jars, bin/ and python/lib/pyspark.zip."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def with_dependencies(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` and everything they require (extras left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        found[key] = importlib.metadata.distribution(name)
        for req in found[key].requires or []:
            if "extra ==" in req:
                continue
            dep = re.match(r"[A-Za-z0-9_.-]+", req)
            try:
                if dep is not None:
                    importlib.metadata.distribution(dep.group(0))
                    todo.append(dep.group(0))
            except importlib.metadata.PackageNotFoundError:
                if ";" not in req:  # a marker (another Python, another platform) may leave it out
                    raise
    return list(found.values())


def executor_python(directory: Path) -> Path:
    """A virtualenv in ``directory`` with only EXECUTOR_DISTRIBUTIONS and their dependencies
    (linked from this Python's site-packages, so nothing is downloaded); its python executable."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for dist in with_dependencies(EXECUTOR_DISTRIBUTIONS):
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            target = site / top
            if source.exists() and not target.exists():
                target.symlink_to(source, target_is_directory=source.is_dir())
    return python


REPO = Path(__file__).resolve().parent.parent


def submit_tune(
    master: str,
    executor: Path,
    tune_args: list[str],
    cwd: Path,
    spark_args: tuple[str, ...] = (),
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """docs/tuning.md's spark-submit line for the tuning job: the driver on this Python, the executors
    on ``executor``, from ``cwd``, with no PYTHONPATH. spark-submit passes the Python driver's
    stderr to its stdout, so the job's own lines are in ``stdout`` (Spark's log is dropped)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            *("--master", master),
            *("--conf", f"spark.pyspark.driver.python={sys.executable}"),
            *("--conf", f"spark.pyspark.python={executor}"),
            *spark_args,
            str(REPO / "analytics" / "tune.py"),
            *tune_args,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=timeout,
    )


class SparkStandalone:
    """A standalone master and ``workers`` workers of ``cores`` cores each, on 127.0.0.1."""

    def __init__(self, workers: int = 1, cores: int = 1, memory: str = "1g", python: Path | None = None):
        self.workers, self.cores, self.memory, self.python = workers, cores, memory, python
        self._tmp = tempfile.TemporaryDirectory(prefix="kthrottle-spark-")
        self.workdir = Path(self._tmp.name)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = free_port()
        self.ui_port = free_port()

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(spark_home()))
        env.pop("PYTHONPATH", None)  # the workers' Python must find nothing of this checkout
        env["SPARK_LOG_DIR"] = str(self.workdir / "logs")
        env["SPARK_WORKER_DIR"] = str(self.workdir / "work")
        if self.python is not None:  # the workers' Python, as a cluster's own would be configured
            env["PYSPARK_PYTHON"] = str(self.python)
        return env

    def _start(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed when the process ends)
        with log:
            self.procs.append(
                subprocess.Popen(
                    [str(spark_home() / "bin" / "spark-class"), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env(),
                    cwd=self.workdir,
                )
            )

    def alive_workers(self) -> int:
        status = f"http://127.0.0.1:{self.ui_port}/json/"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(status, timeout=2) as resp:
            return int(json.load(resp).get("aliveworkers", 0))
        return 0

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for log in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def start(self, timeout: float = 90.0) -> SparkStandalone:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for n in range(self.workers):
            self._start(
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                self.master_url,
            )

        def up() -> bool:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Spark daemon exited:\n{self.log_tail()}")
            return self.alive_workers() >= self.workers

        try:
            wait_until(up, timeout, lambda: f"{self.workers} worker(s) never registered:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._tmp.cleanup()


if __name__ == "__main__":
    with SparkStandalone() as cluster:
        print(cluster.master_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
