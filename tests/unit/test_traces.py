"""Traces: the parser (every bad trace is one clear error with file:line), the Trace's view of a run
(state at a time or step, stalls, resampling), the cluster-trace converters, the shipped examples."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from omnilearn.emulator.spec import trace as trace_mod
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.emulator.spec.links import Link
from omnilearn.emulator.spec.trace import FULL, Refusal, Stall, Trace, WorkerState, load_trace, parse_trace
from omnilearn.emulator.spec.trace_convert import convert_trace
from omnilearn.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "configs" / "traces"

GOOD_CSV = """\
# a comment, and a blank line follow

t,worker,cpus,share,cpuset,rate,delay,stall
0,1,,0.5,,,,
0,2,1.5,,0-1,100mbit,,
5,3,,,,,,2s
10,1,,,,10mbit,5ms,
10,2,,0.25,,,,
20,2,,,,none,,
30,1,,1,,,,
"""


def write(tmp_path: Path, text: str | bytes, name: str = "trace.csv") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_a_good_trace(tmp_path: Path) -> None:
    t = load_trace(write(tmp_path, GOOD_CSV), workers=3)
    assert (t.unit, t.workers, t.span) == ("seconds", 3, 30.0)
    assert t.at(0) == {1: WorkerState(share=0.5), 2: WorkerState(cpus=1.5, cpuset="0-1", link=Link(rate=10**8)),
                       3: FULL}
    # A row changes what it names: worker 1's link arrives at 10 and its share stays 0.5 until 30.
    assert t.at(15)[1] == WorkerState(share=0.5, link=Link(rate=10**7, delay=0.005))
    assert t.at(15)[2] == WorkerState(share=0.25, link=Link(rate=10**8))  # the CPU part is replaced whole
    assert t.at(20)[2] == WorkerState(share=0.25)  # rate none: unshaped
    assert t.at(1000)[1] == WorkerState(share=1.0, link=Link(rate=10**7, delay=0.005))
    assert t.at(-1) == {1: FULL, 2: FULL, 3: FULL}
    assert t.stalls() == [Stall(5.0, 3, 2.0)]
    assert t.stalls_between(0, 5) == [] and t.stalls_between(5, 6, worker=3) == [Stall(5.0, 3, 2.0)]
    assert t.changes() == [0.0, 10.0, 20.0, 30.0]
    assert [s for s, _ in t.segments()] == [0.0, 10.0, 20.0, 30.0]


def test_csv_and_jsonl_are_the_same_trace(tmp_path: Path) -> None:
    rows = [{"step": 0, "worker": 1, "cpus": 0.5}, {"step": 4, "worker": 2, "cpuset": "2-3", "rate": "1gbit"},
            {"step": 4, "worker": 1, "stall": "250ms", "cpus": None}]
    jsonl = load_trace(write(tmp_path, "\n".join(json.dumps(r) for r in rows) + "\n", "t.jsonl"))
    csv = load_trace(write(tmp_path, "step,worker,cpus,cpuset,rate,stall\n0,1,0.5,,,\n4,2,,2-3,1gbit,\n"
                                     "4,1,,,,250ms\n"))
    assert jsonl.events == csv.events and jsonl.unit == csv.unit == "step" and jsonl.workers == 2
    # Without a suffix, the first row decides.
    guessed = parse_trace(write(tmp_path, "\n".join(json.dumps(r) for r in rows), "t.txt").read_bytes(), "t.txt")
    assert isinstance(guessed, Trace) and guessed.events == csv.events


HEADER = "t,worker,cpus,share,cpuset,rate,jitter,delay,stall\n"


@pytest.mark.parametrize("text, line, words", [
    ("t,cpus\n0,1\n", 1, "missing column 'worker'"),
    ("worker,cpus\n1,1\n", 1, "exactly one time column"),
    ("t,step,worker,cpus\n0,0,1,1\n", 1, "exactly one time column"),
    ("t,worker,cpu\n0,1,1\n", 1, "unknown column(s) 'cpu'"),
    ("t,worker,cpus,cpus\n0,1,1,1\n", 1, "appear twice"),
    ("t,worker\n0,1\n", 1, "sets nothing"),
    ("0,1,0.5\n", 1, "must be a header"),
    (HEADER + "5,1,1,,,,,,\n3,2,1,,,,,,\n", 3, "3 comes after 5: rows must be in time order"),
    (HEADER + "-1,1,1,,,,,,\n", 2, "t: expected a non-negative number, got '-1'"),
    (HEADER + "nan,1,1,,,,,,\n", 2, "t: expected a non-negative number"),
    (HEADER + "99999999999,1,1,,,,,,\n", 2, "t: 99999999999 is outside"),
    (HEADER + "0,5,1,,,,,,\n", 2, "unknown worker 5: the job has 4 (1..4)"),
    (HEADER + "0,0,1,,,,,,\n", 2, "worker: 0 is outside [1, 1024]"),
    (HEADER + "0,1.5,1,,,,,,\n", 2, "worker: expected an integer"),
    (HEADER + "0,,1,,,,,,\n", 2, "worker: missing"),
    (HEADER + "0,1,0,,,,,,\n", 2, "cpus: 0 is outside (0, 1024]"),
    (HEADER + "0,1,5000,,,,,,\n", 2, "cpus: 5000 is outside (0, 1024]"),
    (HEADER + "0,1,two,,,,,,\n", 2, "cpus: expected a non-negative number, got 'two'"),
    (HEADER + "0,1,,1.5,,,,,\n", 2, "share: 1.5 is outside (0, 1]"),
    (HEADER + "0,1,1,0.5,,,,,\n", 2, "cpus and share exclude each other"),
    (HEADER + "0,1,,,\"3,0-2\",,,,\n", 2, "cpuset: '3,0-2' is not canonical; write '0-3'"),
    (HEADER + "0,1,,,\"0-1,2\",,,,\n", 2, "cpuset: '0-1,2' is not canonical; write '0-2'"),
    (HEADER + "0,1,,,0-9999,,,,\n", 2, "beyond CPU 4095"),
    (HEADER + "0,1,,,3-1,,,,\n", 2, "range 3-1 is empty"),
    (HEADER + "0,1,,,0 - 3,,,,\n", 2, "cpuset: expected CPU numbers and ranges"),
    (HEADER + "0,1,,,,100mbps,,,\n", 2, "rate: '100mbps' is in bytes per second"),
    (HEADER + "0,1,,,,,2ms,,\n", 2, "jitter: needs a delay"),
    (HEADER + "0,1,,,,,,10,\n", 2, "delay: expected a duration with its unit"),
    (HEADER + "0,1,,,,none,,10ms,\n", 2, "rate: none (unshaped) leaves no room"),
    (HEADER + "0,1,,,,,,,2\n", 2, "stall: expected a duration with its unit"),
    (HEADER + "0,1,,,,,,,2h\n", 2, "stall: expected a duration"),
    (HEADER + "0,1,,,,,,,7200s\n", 2, "stall: '7200s' exceeds 3600s"),
    (HEADER + "0,1,,,," + "9" * 500 + "mbit,,,\n", 2, "rate: '9999"),
    (HEADER + "0,1,,,,,,,0s\n", 2, "stall: must last longer than 0s"),
    (HEADER + "0,1,,,,,,,\n", 2, "sets nothing"),
    (HEADER + "0,1,1,,,,,\n", 2, "has 8 fields, the header 9"),
    (HEADER + "0,1,1,,,,,,\n# ok\n0,1,,,,,,,1s\n", 4, "worker 1 already has a row at t 0 (line 2)"),
    (HEADER + "0,1,\"1,,,,,,,,\n", 2, "not valid CSV"),
    ("step,worker,cpus\n1.5,1,1\n", 2, "step: expected an integer"),
    ("step,worker,cpus\n0,1,1\n", None, None),  # (a control: this one parses)
])
def test_bad_csv_traces_are_one_clear_error(tmp_path: Path, text: str, line: int | None, words: str | None) -> None:
    p = write(tmp_path, text)
    if words is None:
        assert load_trace(p, workers=4).events
        return
    with pytest.raises(UserError) as err:
        load_trace(p, workers=4)
    msg = str(err.value)
    assert msg.startswith(f"{p}:{line}: ") and words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("text, line, words", [
    ('{"t": 0, "worker": 1, "cpus": 1}\n[1, 2]\n', 2, "expected a JSON object, got list"),
    ('{"t": 0, "worker": 1, "cpus": 1}\n{"t": 1, "worker": 1,\n', 2, "not JSON"),
    ('{"t": 0, "worker": 1, "cpus": {"n": 1}}\n', 1, "one flat JSON object"),
    ('{"t": 0, "worker": 1, "cpus": ' + "[" * 480 + "]" * 480 + "}\n", 1, "one flat JSON object"),
    ('{"t": 0, "worker": 1, "cpus": true}\n', 1, "cpus: expected a number, got True"),
    ('{"t": 0, "worker": "w1", "cpus": 1}\n', 1, "worker: expected a non-negative integer, got 'w1'"),
    ('{"t": 0, "worker": 1, "rate": 100000000}\n', 1, "rate: expected a rate with its unit"),
    ('{"t": 0, "worker": 1, "cpuset": 3}\n', 1, "cpuset: expected CPU numbers"),
    ('{"t": 0, "worker": 1, "cpus": 1}\n{"step": 1, "worker": 1, "cpus": 1}\n', 2, "uses step where earlier"),
    ('{"t": 0, "worker": 1, "gpu": 1}\n', 1, "unknown column(s) 'gpu'"),
])
def test_bad_jsonl_traces_are_one_clear_error(tmp_path: Path, text: str, line: int, words: str) -> None:
    p = write(tmp_path, text, "t.jsonl")
    with pytest.raises(UserError) as err:
        load_trace(p, workers=4)
    assert str(err.value).startswith(f"{p}:{line}: ") and words in str(err.value), err.value


def test_files_that_are_not_traces(tmp_path: Path, monkeypatch) -> None:
    def refused(p: Path, words: str) -> None:
        with pytest.raises(UserError, match=words) as err:
            load_trace(p)
        assert str(p) in str(err.value)

    refused(write(tmp_path, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "img.csv"), "binary data")
    refused(write(tmp_path, b"t,worker,cpus\n0,1,1\n" + b"\xff\xfe\n", "latin.csv"), ":3: not UTF-8")
    refused(write(tmp_path, "", "empty.csv"), "empty trace")
    refused(write(tmp_path, "# only a comment\n\n", "comments.csv"), "empty trace")
    refused(write(tmp_path, "t,worker,cpus\n", "header.csv"), "no rows")
    refused(tmp_path / "missing.csv", "not found")
    refused(tmp_path, "not a regular file")
    refused(write(tmp_path, "t,worker,cpus\n0,1," + "1" * 2000 + "\n"), ":2: line longer than 1024")
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as f:
        f.truncate(trace_mod.MAX_TRACE_BYTES + 1)  # sparse: refused by its size, never read
    refused(huge, "larger than the 8388608-byte limit")
    assert isinstance(parse_trace(b"x" * (trace_mod.MAX_TRACE_BYTES + 1)), Refusal)
    monkeypatch.setattr(trace_mod, "MAX_ROWS", 3)
    refused(write(tmp_path, "t,worker,cpus\n" + "".join(f"{i},1,1\n" for i in range(10))), ":5: more than 3 rows")
    p = write(tmp_path, "t,worker,cpus\n0,1,1\n")
    with pytest.raises(UserError, match="unknown trace format 'xml'"):
        load_trace(p, fmt="xml")
    # The parser itself never raises: it refuses.
    for data in (b"\x00", b"t,worker\n", b'{"t": [[[[', b"\xc3\x28", b"t,worker,cpus\n0,1,1\n"):
        assert isinstance(parse_trace(data, "x", workers=4), (Trace, Refusal))


def test_the_parser_never_raises_on_mangled_traces() -> None:
    """Mutations of good CSV and JSONL traces: each parses or is refused, none raises."""
    rng = random.Random(14)
    jsonl = '{"t": 0, "worker": 1, "cpus": 0.5, "rate": "10mbit", "stall": "1s"}\n{"t": 2, "worker": 2, "share": 1}\n'
    alphabet = list(',"{}[]:#-.%\n\r\\ 0123456789eE+tsmbitworkercpusharenone') + ["\x00", "\xe9", "\ufeff", "9" * 400]
    outcomes = set()
    for base in (GOOD_CSV, jsonl):
        for _ in range(1500):
            text = list(base)
            for _ in range(rng.randint(1, 6)):
                i = rng.randrange(len(text) + 1)
                op = rng.random()
                if op < 0.4 and text:
                    text[min(i, len(text) - 1)] = rng.choice(alphabet)
                elif op < 0.7:
                    text.insert(i, rng.choice(alphabet))
                elif text:
                    del text[min(i, len(text) - 1)]
            result = parse_trace("".join(text).encode("utf-8", "surrogatepass"), "fuzz", workers=rng.choice([None, 2, 3]))
            assert isinstance(result, (Trace, Refusal))
            outcomes.add(type(result))
    assert outcomes == {Trace, Refusal}


def test_a_large_trace_parses_whole(tmp_path: Path) -> None:
    rows = "".join(f"{i // 4},{i % 4 + 1},{0.1 + (i % 9) / 10:.1f}\n" for i in range(50_000))
    p = write(tmp_path, "t,worker,share\n" + rows)
    t = load_trace(p, workers=4)
    assert len(t.events) == 50_000
    assert t.at(6000.5)[1] == WorkerState(share=0.1 + (24000 % 9) / 10)


def test_resample_and_units(tmp_path: Path) -> None:
    t = load_trace(write(tmp_path, "t,worker,share,stall\n0,1,0.5,\n30,2,0.25,3s\n60,1,1,\n"))
    assert t.span == 60
    short = t.resample(6)
    assert [e.at for e in short.events] == [0, 3, 6] and short.span == 6
    assert short.stalls() == [Stall(3.0, 2, pytest.approx(0.3))]  # seconds to seconds: stalls scale too
    assert short.at(3) == t.at(30) and short.at(2.9) == t.at(29)
    steps = t.resample(100, unit="step")
    assert steps.unit == "step" and [e.at for e in steps.events] == [0, 50, 100]
    assert steps.stalls() == [Stall(50.0, 2, 3.0)]  # a stall stays seconds long
    # Squeezed below one step per row: positions round, and the later row wins.
    tiny = load_trace(write(tmp_path, "step,worker,share\n0,1,0.5\n1,1,0.2\n10,1,0.9\n")).resample(2)
    assert tiny.at(0)[1] == WorkerState(share=0.2) and tiny.at(2)[1] == WorkerState(share=0.9)


def test_to_csv_round_trips(tmp_path: Path) -> None:
    t = load_trace(write(tmp_path, GOOD_CSV), workers=3)
    again = parse_trace(t.to_csv().encode(), "again.csv", workers=3)
    assert isinstance(again, Trace) and again.events == t.events
    odd = t.resample(7)  # non-integer positions and stall durations
    back = parse_trace(odd.to_csv().encode(), "odd.csv", workers=3)
    assert isinstance(back, Trace) and back.events == odd.events


def test_state_as_allocation() -> None:
    full = Allocation(cpus=2.0, memory=2**30)
    assert FULL.allocation(full) == full
    assert WorkerState(share=0.25).allocation(full) == Allocation(cpus=0.5, memory=2**30)
    assert WorkerState(cpus=1.5, cpuset="0-1").allocation(full) == Allocation(cpuset="0-1", cpus=1.5,
                                                                              memory=2**30)
    assert WorkerState(share=0.5).allocation(Allocation(cpuset="0-3")) == Allocation(cpuset=None, cpus=2.0)


# ---------------------------------------------------------------- cluster traces


def alibaba_sample_lines() -> list[str]:
    """A small synthetic machine_usage.csv (Alibaba v2018 format): 4 machines, 10 minutes at 10 s.

    Deterministic: machine i runs a base load with a burst of co-located work; two samples have no
    CPU value, as gaps in the real trace do. configs/traces/alibaba-machine-usage-sample.csv is this.
    """
    lines = []
    for k in range(60):
        t = 386_640 + 10 * k
        for i, (base, burst_from, burst_to, burst) in enumerate(
                [(20, 10, 25, 60), (35, 30, 45, 50), (10, 0, 60, 0), (50, 40, 55, 30)]):
            util = base + (burst if burst_from <= k < burst_to else 0) + (k * 7 + i * 3) % 5
            cpu = "" if (i, k) in ((1, 17), (3, 52)) else str(min(util, 100))
            mem = 60 + (k + i) % 9
            lines.append(f"m_{1931 + i},{t},{cpu},{mem},,,{30 + k % 7}.{i}4,{28 + k % 5}.{i}1,{3 + k % 4}")
    return lines


def test_alibaba_conversion(tmp_path: Path) -> None:
    # Two machines, four 10-s samples each; m_2 has a gap. Machine order: first seen.
    src = write(tmp_path, "m_2,100,50,70,,,1.0,1.0,5\nm_1,100,20,70,,,1.0,1.0,5\n"
                          "m_2,110,,70,,,1.0,1.0,5\nm_1,110,40,70,,,1.0,1.0,5\n"
                          "m_2,120,100,70,,,1.0,1.0,5\nm_1,120,60,70,,,1.0,1.0,5\n"
                          "m_2,130,90,70,,,1.0,1.0,5\nm_1,130,80,70,,,1.0,1.0,5\n"
                          "m_3,130,10,70,,,1.0,1.0,5\n", "machine_usage.csv")
    out = tmp_path / "converted.csv"
    t = convert_trace(src, "alibaba2018", workers=2, length_s=60, out=out, points=2)
    assert t.unit == "seconds" and t.workers == 2 and t.span == 60
    # Windows: [100, 120) and [120, 140). m_2 -> worker 1: utilisation 0.5 then 0.95 (floored share 0.05);
    # m_1 -> worker 2: 0.3 then 0.7.
    assert t.at(0) == {1: WorkerState(share=0.5), 2: WorkerState(share=0.7)}
    assert t.at(30) == {1: WorkerState(share=0.05), 2: WorkerState(share=0.3)} == t.at(60)
    text = out.read_text()
    assert text.startswith("# Converted from the alibaba2018 trace 'machine_usage.csv'") and "m_2, m_1" in text
    assert load_trace(out).events == t.events
    picked = convert_trace(src, "alibaba2018", workers=1, length_s=10, machines=["m_3"], points=1)
    assert picked.at(0) == {1: WorkerState(share=0.9)}


@pytest.mark.parametrize("text, words", [
    ("m_1,100,50,70\n", ":1: has 4 fields; alibaba2018 machine_usage has 9"),
    ("m_1,100,fifty,70,,,1,1,5\n", ":1: cpu_util_percent 'fifty' is not a number"),
    ("m_1,100,150,70,,,1,1,5\n", ":1: cpu_util_percent 150 is above 100"),
    ("m_1,-5,50,70,,,1,1,5\n", ":1: time_stamp '-5' must be a finite number >= 0"),
    ("m 1,100,50,70,,,1,1,5\n", ":1: machine id 'm 1' is not"),
    ("m_1,100,50,70,,,1,1,5\n", ": 1 machine(s) with CPU data, 2 workers asked for"),
    ("m_1,100,50\x00,70,,,1,1,5\n", ":1: binary data"),
])
def test_bad_alibaba_sources(tmp_path: Path, text: str, words: str) -> None:
    src = write(tmp_path, text, "machine_usage.csv")
    with pytest.raises(UserError) as err:
        convert_trace(src, "alibaba2018", workers=2, length_s=60)
    assert str(err.value).startswith(str(src)) and words in str(err.value), err.value


def test_converter_arguments_are_checked(tmp_path: Path) -> None:
    src = write(tmp_path, "m_1,100,50,70,,,1,1,5\n")
    for kwargs, words in [({"fmt": "azure"}, "known formats are alibaba2018, google2011"),
                          ({"workers": 0}, "workers must be in 1..1024"),
                          ({"length_s": 0}, "length_s must be in"),
                          ({"points": 0}, "points must be in"),
                          ({"machines": ["m_1", "m_2"]}, "2 named for 1 workers"),
                          ({"machines": ["m_9"]}, "no CPU data for machine(s) m_9")]:
        args = {"fmt": "alibaba2018", "workers": 1, "length_s": 60, **kwargs}
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            convert_trace(src, **args)
    with pytest.raises(UserError, match="cannot read"):
        convert_trace(tmp_path / "nope.csv", "alibaba2018", 1, 60)


def _google_row(start_s: int, machine: int, cpu: float, task: int, fields: int = 20) -> str:
    row = [str(start_s * 10**6), str((start_s + 300) * 10**6), "6251812952", str(task), str(machine), f"{cpu}",
           "0.01", "0.02", "0", "0", "0.02", "0.001", "0", "0.1", "0.01", "1.5", "0.002", "0", "0", "0.05"]
    return ",".join(row[:fields])


def test_google_conversion(tmp_path: Path) -> None:
    rows = [
        _google_row(600, 5, 0.10, 0), _google_row(600, 5, 0.15, 1), _google_row(600, 7, 0.4, 2, fields=19),
        _google_row(900, 5, 0.5, 0), _google_row(900, 7, 0.2, 2), _google_row(900, 7, 0.1, 3),
        _google_row(900, 9, 0.9, 4),
    ]
    src = write(tmp_path, "\n".join(rows) + "\n", "part-00000-of-00500.csv")
    t = convert_trace(src, "google2011", workers=2, length_s=100, points=2)
    # Machine 5: tasks add up to 0.25, then 0.5; machine 7: 0.4, then 0.3 (normalised to the largest machine).
    assert t.at(0) == {1: WorkerState(share=0.75), 2: WorkerState(share=0.6)}
    assert t.at(50) == {1: WorkerState(share=0.5), 2: WorkerState(share=0.7)}
    half = convert_trace(src, "google2011", workers=2, length_s=100, points=2, capacity=0.5)
    assert half.at(50) == {1: WorkerState(share=0.05), 2: WorkerState(share=0.4)}
    bad = write(tmp_path, _google_row(600, 5, 0.1, 0, fields=12) + "\n", "bad.csv")
    with pytest.raises(UserError, match=":1: has 12 fields; google2011 task_usage has 19 or 20"):
        convert_trace(bad, "google2011", workers=1, length_s=10)


# ---------------------------------------------------------------- shipped examples


def test_shipped_example_traces() -> None:
    bursty = load_trace(TRACES / "bursty.csv", workers=4)
    assert bursty.span == 120 and len(bursty.stalls()) >= 4
    assert all(0 < s.share <= 1 for _, states in bursty.segments() for s in states.values() if s.share)
    sample = TRACES / "alibaba-machine-usage-sample.csv"
    assert sample.read_text().splitlines() == alibaba_sample_lines()
    shipped = load_trace(TRACES / "alibaba-4workers.csv", workers=4)
    fresh = convert_trace(sample, "alibaba2018", workers=4, length_s=120, points=12)
    assert shipped.events == fresh.events and shipped.span == 120
    assert len({tuple(sorted((w, s.share) for w, s in states.items())) for _, states in shipped.segments()}) > 3


# ---------------------------------------------------------------- a trace as a job's schedule


def _trace_job(tmp_path: Path, trace: Path, *extra: tuple[str, object]):
    from omnilearn import config

    return config.build(None, [("emulation.trace", str(trace)), ("emulation.allocation", "quota"),
                               ("train.epochs", 4), *extra])


def test_a_trace_becomes_levels_stretched_over_the_epochs(tmp_path: Path) -> None:
    from omnilearn.emulator.spec.plan import EmulationPlan, build_plan

    trace = write(tmp_path, "t,worker,share,rate,stall\n0,1,1.0,,\n10,2,0.5,,\n20,3,,,2s\n30,2,1.0,,\n"
                            "30,4,,50mbit,\n40,1,1.0,,\n")
    plan = build_plan(_trace_job(tmp_path, trace), host=[0, 1])
    s = plan.schedule
    assert s.name == "trace:trace" and s.unit == "epoch"
    # 40 s of trace over 4 epochs: a row at t starts at epoch t / 10; the restated row at 40 changes nothing.
    assert s.starts == (0.0, 1.0, 2.0, 3.0) and s.levels == ("T00", "T01", "T02", "T03")
    full = round(0.5 * 0.85, 4)  # HL1 on 2 CPUs (at the default host share): a share is a fraction of it
    assert plan.allocation("T00", "worker2") == Allocation(cpus=full)
    assert plan.allocation("T01", "worker2") == Allocation(cpus=full / 2)
    assert plan.allocation("T02", "worker2") == Allocation(cpus=full / 2)  # the stall's level keeps the state
    assert plan.stalls == {"T02": {"worker3": 2.0}} and plan.stall("T02", "worker3") == 2.0
    assert plan.link("T03", "worker4") == Link(rate=50_000_000) and plan.link("T02", "worker4") is None
    assert plan.allocation("T03", "worker2") == Allocation(cpus=full)
    assert EmulationPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan  # the job file keeps it all
    # The level a share is a fraction of: emulation.hl.
    hl8 = build_plan(_trace_job(tmp_path, trace, ("emulation.hl", "HL8")), host=[0, 1])
    assert hl8.allocation("T01", "worker2").cpus == pytest.approx(0.25 * 0.85 / 2, abs=1e-4)
    # A schedule naming a trace file is the same as emulation.trace.
    from omnilearn import config
    same = build_plan(config.build(None, [("emulation.schedule", str(trace)), ("emulation.allocation", "quota"),
                                          ("train.epochs", 4)]), host=[0, 1])
    assert same.schedule == s and same.levels == plan.levels


def test_a_returning_state_reuses_its_level_and_stalls_get_their_own(tmp_path: Path) -> None:
    from omnilearn.emulator.spec.plan import build_plan

    trace = write(tmp_path, "t,worker,share,stall\n0,1,1.0,\n10,1,0.5,\n20,1,1.0,\n25,1,,1s\n30,2,,1s\n40,1,1.0,\n")
    plan = build_plan(_trace_job(tmp_path, trace), host=[0, 1])
    assert plan.schedule.levels == ("T00", "T01", "T00", "T02", "T03", "T00")
    assert plan.levels["T02"] == plan.levels["T00"] == plan.levels["T03"]
    assert plan.stalls == {"T02": {"worker1": 1.0}, "T03": {"worker2": 1.0}}
    # Steps at epochs 2.0 and 2.75 step over the stall levels at 2.5 and 3.0: the worker goes through
    # them, so no stall is lost however coarse the steps.
    assert plan.schedule.starts == (0.0, 1.0, 2.0, 2.5, 3.0, 4.0)
    assert plan.stalls_passed(2.0, 2.75) == [] and plan.stalls_passed(2.0, 3.5) == ["T02"]
    assert plan.stalls_passed(0.0, 4.0) == ["T02", "T03"] and plan.stalls_passed(0.0, 3.99) == ["T02"]  # T03 in force


@pytest.mark.parametrize("text, words", [
    ("t,worker,share\n0,5,0.5\n", "trace.csv:2: worker: unknown worker 5: the job has 4"),
    ("t,worker,share\n0,1,1.5\n", "trace.csv:2: share: 1.5 is outside (0, 1]"),
    ("t,worker,cpuset\n0,1,0-7\n", "names CPUs this host lacks: 2-7"),
])
def test_a_bad_trace_stops_the_plan_naming_file_and_line(tmp_path: Path, text: str, words: str) -> None:
    from omnilearn.emulator.spec.plan import build_plan

    with pytest.raises(UserError, match="emulation.trace") as e:
        build_plan(_trace_job(tmp_path, write(tmp_path, text)), host=[0, 1])
    assert words in str(e.value)


def test_links_from_the_trace_and_from_the_config_exclude_each_other(tmp_path: Path) -> None:
    from omnilearn.emulator.spec.plan import build_plan

    shaped = write(tmp_path, "t,worker,rate\n0,1,100mbit\n")
    with pytest.raises(UserError, match="the trace .* sets links itself"):
        build_plan(_trace_job(tmp_path, shaped, ("emulation.links", {"worker2": "10mbit"})), host=[0, 1])
    unshaped = write(tmp_path, "t,worker,share\n0,1,0.5\n10,1,1.0\n", "cpu.csv")
    plan = build_plan(_trace_job(tmp_path, unshaped, ("emulation.links", {"worker2": "10mbit"})), host=[0, 1])
    assert all(plan.link(level, "worker2") == Link(rate=10_000_000) for level in plan.levels)


def test_shipped_traces_drive_the_demo_job() -> None:
    from omnilearn import config
    from omnilearn.emulator.spec.plan import build_plan

    for name in ("bursty.csv", "alibaba-4workers.csv"):
        cfg = config.build(str(ROOT / "configs" / "demo.yaml"), [("emulation.trace", str(TRACES / name))])
        plan = build_plan(cfg, host=[0, 1])
        assert plan.schedule.name == f"trace:{Path(name).stem}" and len(set(plan.schedule.levels)) > 3
        assert plan.schedule.starts[-1] <= cfg.train.epochs
    assert build_plan(config.build(str(ROOT / "configs" / "demo.yaml"), [("emulation.trace", str(TRACES / "bursty.csv"))]),
                      host=[0, 1]).stalls
