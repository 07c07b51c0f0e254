"""The demo says what the throttled client got in its two parts (the burst a Kafka quota allows,
then the held rate) rather than one average that is neither."""

from __future__ import annotations

import pytest

from dev.demo import explain_throttled

QUOTA = 512 * 1024
MiB = 1024 * 1024


def _delivered(per_second: list[float]) -> list[int]:
    total = [0]
    for got in per_second:
        total.append(total[-1] + int(got))
    return total


def test_the_burst_and_the_held_rate_are_told_apart(capsys: pytest.CaptureFixture[str]) -> None:
    explain_throttled(_delivered([3 * MiB, 2.5 * MiB] + [QUOTA * 1.01] * 18), QUOTA)
    out = capsys.readouterr().out
    assert "burst: 5.5 MiB in its first 2s, 4.5 MiB above its quota" in out
    assert "held: 517 KiB/s over seconds 2-20 against its quota of 512 KiB/s (+1.0%)" in out
    assert "average over the whole 20s: 747 KiB/s" in out


def test_a_client_that_never_settles_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    explain_throttled(_delivered([3 * MiB] * 10), QUOTA)
    assert "never settled at its quota" in capsys.readouterr().out
