"""The container image's Dockerfile: hadolint, what hadolint does not check (a non-root final
stage without build tools, the health check, the entry point), and the builder's steps run for
real (the wheel it builds from exactly the files it copies installs a working `kthrottle`).

No Docker engine is needed (none runs here): the builder's two steps are the same pip commands.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def args_of(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, continuation lines joined and comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            if instruction == "ARG":
                key, _, default = rest.partition("=")
                global_args[key.strip()] = default.strip()
        else:
            stages[-1].instructions.append((instruction, rest.strip()))
    return global_args, stages


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)


Parsed = tuple[dict[str, str], list[Stage]]


@pytest.fixture(scope="module")
def dockerfile() -> Parsed:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))


def test_hadolint_finds_nothing(hadolint: str) -> None:
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_multi_stage_with_a_slim_python_311_final_stage(dockerfile: Parsed) -> None:
    args, stages = dockerfile
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert builder.name == "builder"
    assert args["PYTHON_VERSION"].startswith("3.11.")  # pinned to a patch release
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", expand(final.base, args)), final.base
    # Only the venv comes from the builder.
    copies = final.args_of("COPY")
    assert copies == ["--from=builder /opt/kthrottle /opt/kthrottle"]


def test_final_stage_runs_as_a_fixed_non_root_uid(dockerfile: Parsed) -> None:
    _, stages = dockerfile
    final = stages[-1]
    local = {k: v for k, _, v in (a.partition("=") for a in final.args_of("ARG"))}
    users = final.args_of("USER")
    assert users, "the final stage sets no USER (it would run as root)"
    uid = expand(users[-1], local).split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"USER {users[-1]} is not a fixed non-root numeric uid"
    # Nothing after USER switches back.
    last_user = max(i for i, (ins, _) in enumerate(final.instructions) if ins == "USER")
    assert all(ins != "USER" for ins, _ in final.instructions[last_user + 1 :])


def test_final_stage_has_no_compilers_or_build_tools(dockerfile: Parsed) -> None:
    _, stages = dockerfile
    final = stages[-1]
    text = " ".join(a for _, a in final.instructions).lower()
    build_tools = (
        "gcc",
        "g++",
        "build-essential",
        "make ",
        "clang",
        "apt-get install",
        "pip install",
        "cargo",
    )
    for tool in build_tools:
        assert tool not in text, f"final stage mentions {tool!r}"
    assert "-slim" in final.base
    # The builder installs the project with uvloop (a core dependency) and checks it imports.
    builder_runs = " ".join(stages[0].args_of("RUN"))
    assert "import uvloop" in builder_runs
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("uvloop") and "linux" not in d.split(";")[-1] for d in deps)


def test_healthcheck_entrypoint_and_stop_signal(dockerfile: Parsed) -> None:
    _, stages = dockerfile
    final = stages[-1]
    (health,) = final.args_of("HEALTHCHECK")
    exec_form = json.loads(health[health.index("CMD") + 3 :].strip())
    assert exec_form[:2] == ["python", "-c"]
    assert "urllib.request" in exec_form[2] and "/healthz" in exec_form[2]
    assert "KTHROTTLE_ADMIN_PORT" in exec_form[2]
    assert "KTHROTTLE_ADMIN_PORT=9644" in " ".join(final.args_of("ENV"))
    # The probe's Python snippet compiles.
    compile(exec_form[2], "<healthcheck>", "exec")
    assert json.loads(final.args_of("ENTRYPOINT")[-1]) == ["kthrottle"]
    assert json.loads(final.args_of("CMD")[-1]) == ["run", "--config", "/etc/kthrottle/kthrottle.yaml"]
    assert final.args_of("STOPSIGNAL") == ["SIGTERM"]
    exposed = " ".join(final.args_of("EXPOSE")).split()
    assert {"9092", "9644"} <= set(exposed)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern that matches decides (a leading ! re-includes)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pat) for p in prefixes) or fnmatch.fnmatch(path, pat.replace("**/", "*/")):
            ignored = not negate
    return ignored


def _builder_sources(stages: list[Stage]) -> list[str]:
    sources: list[str] = []
    for arguments in stages[0].args_of("COPY"):
        words = [w for w in shlex.split(arguments) if not w.startswith("--")]
        sources += words[:-1]
    return sources


def test_dockerignore_lets_the_build_context_hold_what_the_builder_copies(
    dockerfile: Parsed,
) -> None:
    _, stages = dockerfile
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for source in _builder_sources(stages):
        assert (REPO / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is copied but .dockerignore excludes it"
        assert not _ignored(f"{source}/x.py" if (REPO / source).is_dir() else source, patterns)
    for kept_out in (".git", "tests/unit/test_sasl.py", ".bin/kthrottle", "proxy/__pycache__/x.pyc"):
        assert _ignored(kept_out, patterns), f"{kept_out} would be sent to the Docker daemon"


def test_the_builders_wheel_from_the_copied_files_runs_kthrottle(dockerfile: Parsed, tmp_path: Path) -> None:
    """The builder's steps without Docker: copy what its COPY lines copy, build the wheel, install
    it with no access to the checkout, and run its `kthrottle` console script."""
    _, stages = dockerfile
    src = tmp_path / "src"
    src.mkdir()
    for source in _builder_sources(stages):
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(origin, src / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (src / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, src / source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("--wheel-dir", str(wheels), str(src)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("kthrottle-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    config = tmp_path / "kthrottle.yaml"
    config.write_text(
        "mode: gateway\nbind_host: 0.0.0.0\nadmin: {host: 0.0.0.0, port: 9644}\n"
        "gateway: {upstream_bootstrap: ['kafka-0:9092']}\nquotas_file: quotas.yaml\n"
    )
    (tmp_path / "quotas.yaml").write_text("quotas:\n  users:\n    <default>: {producer_byte_rate: 1048576}\n")
    env["PYTHONPATH"] = str(target)
    run = subprocess.run(
        [sys.executable, str(target / "bin" / "kthrottle"), "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "ok (gateway mode" in run.stdout
    # It ran the installed copy, not the checkout.
    where = subprocess.run(
        [sys.executable, "-c", "import proxy.cli; print(proxy.cli.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr


def test_healthcheck_and_stop_signal_against_a_running_proxy(dockerfile: Parsed, tmp_path: Path) -> None:
    """The image's HEALTHCHECK command, as Docker runs it, passes against a running kthrottle; the
    STOPSIGNAL makes it drain and exit 0; then the health check fails."""
    _, stages = dockerfile
    final = stages[-1]
    (health,) = final.args_of("HEALTHCHECK")
    command = json.loads(health[health.index("CMD") + 3 :].strip())
    signal_name = final.args_of("STOPSIGNAL")[-1]
    config = tmp_path / "kthrottle.yaml"
    config.write_text(
        "mode: gateway\nbind_host: 127.0.0.1\ndrain_seconds: 1\n"
        "admin: {host: 127.0.0.1, port: 0}\n"
        "gateway: {bootstrap_port: 0, upstream_bootstrap: ['127.0.0.1:1']}\n"
    )
    ready = tmp_path / "ready.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = (tmp_path / "proxy.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "run", "--config", str(config), "--ready-file", str(ready)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(300):  # up to 30 s for the proxy to come up
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), f"the proxy did not start: {(tmp_path / 'proxy.log').read_text()}"
        admin_port = json.loads(ready.read_text())["admin_port"]
        check_env = dict(env, KTHROTTLE_ADMIN_PORT=str(admin_port))
        healthy = subprocess.run(command, env=check_env, capture_output=True, text=True, timeout=30)
        assert healthy.returncode == 0, healthy.stderr
        proc.send_signal(getattr(signal, signal_name))
        assert proc.wait(timeout=60) == 0
        stopped = subprocess.run(command, env=check_env, capture_output=True, text=True, timeout=30)
        assert stopped.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def test_build_inputs_for_private_indexes_and_the_lean_default(dockerfile: Parsed) -> None:
    """Every pip step can trust a CA bundle and read a pip config given as BuildKit secrets (never
    stored in a layer); index URLs are build args; pyarrow is an extra the default build leaves out."""
    _, stages = dockerfile
    builder, final = stages[0], stages[-1]
    assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"} <= {a.partition("=")[0] for a in builder.args_of("ARG")}
    assert 'KTHROTTLE_EXTRAS=""' in builder.args_of("ARG")
    pip_steps = [run for run in builder.args_of("RUN") if "pip install" in run]
    assert len(pip_steps) == 3  # pip itself, the project into the runtime venv, the mypyc build venv
    for run in pip_steps:
        assert "--mount=type=secret,id=pip_ca" in run and "--mount=type=secret,id=pip_conf" in run, run
        assert ". /usr/local/bin/pip_env" in run, run
    (runtime,) = [run for run in pip_steps if '/opt/kthrottle/bin/pip install "${wheel}' in run]
    assert "${KTHROTTLE_EXTRAS:+[${KTHROTTLE_EXTRAS}]}" in runtime
    assert not any("pip" in run for run in final.args_of("RUN"))  # no pip config reaches the image
    with open(REPO / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    assert not any(dep.startswith("pyarrow") for dep in project["dependencies"])
    assert any(dep.startswith("pyarrow") for dep in project["optional-dependencies"]["capture"])
