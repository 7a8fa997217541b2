"""The suite's own rules, checked by reading its sources (a grep, with the patterns it forbids listed here).

- No test asserts a wall-clock duration or a performance ratio measured on the host: on a shared, loaded
  machine such an assertion tests the machine. What a test asserts about speed becomes a deterministic
  check (a replay through the simulator, a fake clock: ``tests/fakes.py``) or a measurement in
  ``omnilearn bench`` / ``omnilearn calibrate`` whose figures go to the results files.
- The unit tier (``make check``) starts no process, needs no root, Docker or network, and never sleeps.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
UNIT = TESTS / "unit"

# An assertion (or a comparison an assert is built from) on time measured on this host, or on a
# performance figure of a run on it.
FORBIDDEN_EVERYWHERE: dict[str, str] = {
    "an assert on a time difference": r"assert\b.*\b(time|monotonic|perf_counter|process_time)\(\)\s*-",
    "an assert on an elapsed time or latency": r"assert\b.*\b(elapsed|latency|duration|stopped_s|ack_s|wall_s)\w*\s*[<>]",
    "an assert on a measured speed ratio or spread": (r"assert\b.*\b(update_rate_spread|measured_ratio|speedup|"
                                                      r"samples_per_s|cpu_rate\(|free\s*/\s*limited)\b.*[<>]"),
    "an assert on a transfer rate within bounds": r"assert\b.*\d\s*\*\s*(\w+\.)?rate\b",
    "an assert on a measured time against a bound": r"assert\b.*\w_(ms|s)\"\]\s*[<>]=?\s*[1-9]",
}
FORBIDDEN_IN_UNIT: dict[str, str] = {
    "a sleep (use tests/fakes.py's FakeClock)": r"\btime\.sleep\(|\bsleep\(\d",
    "a process": r"\bsubprocess\b|\bPopen\b|\bmultiprocessing\b|\bos\.fork\(|\bos\.system\(",
    "a Docker daemon": r"\bdocker_client\b|\bworker_image\b|pytest\.mark\.docker",
    "the network": r"\bsocket\.socket\((?!socket\.AF_UNIX)|\bsocket\.create_connection\(|\burlopen\(",
}
THIS = Path(__file__).resolve()


def _offences(files: list[Path], patterns: dict[str, str]) -> list[str]:
    found = []
    for path in files:
        if path.resolve() == THIS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for why, pattern in patterns.items():
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(TESTS)}:{n}: {why}: {line.strip()}")
    return found


def test_no_test_asserts_a_duration_or_a_performance_ratio() -> None:
    offences = _offences(sorted(TESTS.rglob("*.py")), FORBIDDEN_EVERYWHERE)
    assert not offences, "\n".join(offences)


def test_the_unit_tier_starts_no_process_and_never_sleeps() -> None:
    """Read from the sources; at run time tests/unit/conftest.py also refuses every process a test starts."""
    offences = _offences(sorted(p for p in UNIT.rglob("*.py") if p.name != "conftest.py"), FORBIDDEN_IN_UNIT)
    assert not offences, "\n".join(offences)


def test_the_patterns_catch_what_they_forbid() -> None:
    """The check itself: each pattern flags a line of the kind it forbids."""
    bad = {
        "an assert on a time difference": "assert time.monotonic() - t0 < 2",
        "an assert on an elapsed time or latency": "assert elapsed < 15, elapsed",
        "an assert on a measured speed ratio or spread": 'assert d["update_rate_spread"] < 1.6',
        "an assert on a transfer rate within bounds": "assert other > 3 * SLOW.rate",
        "an assert on a measured time against a bound": 'assert s["allreduce_ms"] > 150, s',
        "a sleep (use tests/fakes.py's FakeClock)": "time.sleep(0.1)",
        "a process": "subprocess.run(['true'])",
        "a Docker daemon": "def test_x(docker_client): ...",
        "the network": "socket.create_connection(('h', 1))",
    }
    patterns = FORBIDDEN_EVERYWHERE | FORBIDDEN_IN_UNIT
    assert set(bad) == set(patterns)
    for why, line in bad.items():
        assert re.search(patterns[why], line), why


def test_every_test_module_is_in_a_tier() -> None:
    loose = [p.name for p in TESTS.glob("test_*.py")]
    assert not loose, f"test modules outside tests/unit, tests/integration, tests/docker: {loose}"
    for path in TESTS.rglob("test_*.py"):
        tier = path.relative_to(TESTS).parts[0]
        assert tier in ("unit", "integration", "docker"), path
