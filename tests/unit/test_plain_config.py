"""The quota config as Spark executors get it: plain attributes that need no pydantic."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from quota.config import QuotaConfig
from quota.entities import resolve
from quota.keys import CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_BYTE_RATE, PRODUCER_IDS_RATE
from quota.plain_config import plain

REPO = Path(__file__).resolve().parents[2]

CFG = QuotaConfig.model_validate(
    {
        "window": {"num": 5, "size_seconds": 2},
        "producer_ids": {"window": {"num": 3, "size_seconds": 60}},
        "users": {
            "alice": {"producer_byte_rate": 1000, "clients": {"app": {"consumer_byte_rate": 2000}}},
            "<default>": {
                "producer_ids_rate": 0.5,
                "clients": {"<default>": {"controller_mutation_rate": 3}},
            },
        },
        "clients": {"tool": {"producer_byte_rate": 500}},
        "topics": {"orders": {"producer.byte.rate": 4000}},
    }
)


def test_resolves_every_entity_and_window_as_the_model_does() -> None:
    flat = plain(CFG)
    for user in ("alice", "bob", ""):
        for client_id in ("app", "tool", "other"):
            for key in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_IDS_RATE):
                assert resolve(flat, user, client_id, key) == resolve(CFG, user, client_id, key)
    assert flat.window.quota_window() == CFG.window.quota_window()
    assert flat.producer_ids.window.quota_window() == CFG.producer_ids.window.quota_window()
    assert flat.topics["orders"].producer_byte_rate == 4000


def test_an_executor_without_pydantic_runs_the_engines_on_it() -> None:
    """Unpickled and used by the replay (all four quota engines) in a Python where pydantic and
    PyYAML cannot be imported, as on a Spark worker that has only pyspark's own dependencies."""
    script = (
        "import pickle, sys\n"
        "for name in ('pydantic', 'pydantic_core', 'yaml'):\n"
        "    sys.modules[name] = None\n"
        "from analytics.replay import _Replayer\n"
        "cfg = pickle.loads(sys.stdin.buffer.read())\n"
        "replayer = _Replayer(cfg, 0.0, True, {})\n"
        "print(replayer.produce.window.num, replayer.produce.topic_quota('orders'))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(plain(CFG)),
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr.decode()
    assert ran.stdout.decode().split() == ["5", "4000.0"]
