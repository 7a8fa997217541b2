"""The README and docs/ say only what is true of this checkout, as ``test_cpus_allocation.py`` does for
the level table.

- The README is a front door: at most 250 lines, the first command early, short sentences, no history.
- Every path, command, flag, make target and config key the README and docs/ name exists.
- Every link resolves, to a file and to a heading.
- Every record kind the code writes is in the run-folder reference.
- A section that quotes a measured figure links the results file that holds its command.

Paths are checked as they are: a file moved without its docs fails here, by name.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from omnilearn import docs_gen
from omnilearn.emulator.protocol.audit import ACK_STATUSES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytorch" / "omnilearn"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
RESULTS = sorted((ROOT / "results").glob("*.md"))
PAGES = [README, ROOT / "cpus_allocation.md", *DOCS]  # what a user reads as describing this checkout
GUIDE = [README, ROOT / "cpus_allocation.md", *(p for p in DOCS if "reference" not in p.parts)]  # prose written by hand

ROOT_DIRS = ("pytorch", "configs", "examples", "scripts", "tests", "docs", "results", "figures", "docker")
PACKAGE_DIRS = tuple(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
HISTORY = re.compile(r"\b(now|earlier|today|today's|currently|previously|formerly|recently|nowadays)\b", re.I)
CONFIG_SECTIONS = tuple(name for name, _ in docs_gen.section_classes())


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def code_blocks(text: str) -> list[str]:
    """The lines inside fenced code blocks."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def inline_code(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def prose_sentences(text: str) -> list[str]:
    """Sentences of the prose: code blocks, tables, headings and images removed; a list item or a
    paragraph ends a sentence."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("|", "#", "![")) or line.startswith("    "):
            blocks.append(" ".join(current))
            current = []
        elif s.startswith(("- ", "* ", "1. ", "2. ", "3. ")):
            blocks.append(" ".join(current))
            current = [s[2:]]
        else:
            current.append(s)
    blocks.append(" ".join(current))
    sentences = []
    for block in blocks:
        sentences += [x for x in re.split(r"(?<=[.!?;:])\s+(?=[A-Z`*(\[])", block) if x.strip()]
    return sentences


def words(sentence: str) -> int:
    return len(sentence.split())


# ---------------------------------------------------------------- the README


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_readme_first_command_comes_early() -> None:
    lines = README.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("```bash"))
    assert first + 2 <= 60, f"the first command is at line {first + 2}"


def test_readme_sentences_are_short() -> None:
    lengths = [words(s) for s in prose_sentences(README.read_text())]
    assert len(lengths) > 50
    assert statistics.median(lengths) <= 22, f"median sentence {statistics.median(lengths)} words"


def test_sentence_measure_counts_what_it_should() -> None:
    """The guard: a long run-on paragraph raises the median; code and tables do not count."""
    text = "One two three.\n\n```\nnot a sentence at all here\n```\n| a | b |\n" + "Four five six seven. " * 3
    assert [words(s) for s in prose_sentences(text)] == [3, 4, 4, 4]
    assert statistics.median(words(s) for s in prose_sentences("word " * 39 + "word.")) == 40


@pytest.mark.parametrize("page", GUIDE, ids=rel)
def test_no_history_words(page: Path) -> None:
    found = [(i + 1, line) for i, line in enumerate(page.read_text().splitlines()) if HISTORY.search(line)]
    assert not found, f"{rel(page)}: history words at {found}"


def test_readme_names_the_test_command() -> None:
    text = README.read_text()
    assert "make test " in text and "make check " in text


# ---------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[`*_]", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", [*PAGES, *RESULTS], ids=rel)
def test_links_resolve(page: Path) -> None:
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{rel(page)}: link to {target}: no such heading"


# ---------------------------------------------------------------- paths, commands, flags, keys


def named_paths(text: str) -> list[str]:
    """Repository paths a page names: any token under a top-level folder, and package-relative paths
    (``emulator/protocol/toggler.py``) or root files in inline code."""
    out = re.findall(rf"(?<![\w./<-])((?:{'|'.join(ROOT_DIRS)})/[\w./-]*)", text)
    for code in inline_code(text):
        token = code.strip()
        if " " in token or any(c in token for c in "<>*$:=") or token.startswith(("/", "OUT", "DIR")):
            continue
        first = token.split("/")[0]
        if first in PACKAGE_DIRS and token.endswith((".py", "/")) or re.fullmatch(r"[a-z_]+\.py", token):
            out.append(f"pytorch/omnilearn/{token}")
        elif token in ("Makefile", "Dockerfile", "docker_install.sh", "cpus_allocation.md", "pyproject.toml",
                       "requirements.lock"):
            out.append(token)
    for block in code_blocks(text):  # diagrams name modules by package-relative paths
        out += [f"pytorch/omnilearn/{m}" for m in
                re.findall(rf"(?<![\w./-])((?:{'|'.join(PACKAGE_DIRS)})/[\w/]*\.py)\b", block)]
    return [p.rstrip(".,;:") for p in out]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_paths_exist(page: Path) -> None:
    missing = sorted({p for p in named_paths(page.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{rel(page)} names paths that do not exist: {missing}"


def command_lines(text: str) -> list[str]:
    """``omnilearn ...`` command lines: lines of code blocks and inline code that start with it."""
    lines = [line for block in code_blocks(text) for line in block.splitlines()] + inline_code(text)
    out = []
    for line in lines:
        line = re.sub(r"^\s*(\$ )?(\.venv/bin/)?", "", line)
        if re.match(r"omnilearn [a-z]", line):
            out.append(line.split(" #")[0])
    return out


COMMANDS = {cmd: set(flags) for cmd, flags in docs_gen.cli_flags().items()}


def check_command(line: str) -> str | None:
    """None if the command and its flags exist, else what is wrong."""
    tokens = line.split()
    cmd = "omnilearn"
    rest = tokens[1:]
    while rest and f"{cmd} {rest[0]}" in COMMANDS:
        cmd, rest = f"{cmd} {rest[0]}", rest[1:]
    if cmd == "omnilearn":
        return f"no command {tokens[1]!r}"
    for tok in rest:
        if tok == "--":  # emulate: the command that follows is not ours
            break
        flag = tok.split("=")[0]
        if flag.startswith("--") and flag not in COMMANDS[cmd]:
            return f"{cmd}: no flag {flag}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_commands_and_flags_exist(page: Path) -> None:
    wrong = [(line, why) for line in command_lines(page.read_text()) if (why := check_command(line))]
    assert not wrong, f"{rel(page)}: {wrong}"


def test_command_check_can_fail() -> None:
    assert check_command("omnilearn run --hl HL8 --compare") is None
    assert check_command("omnilearn cluster down --out runs/x") is None
    assert check_command("omnilearn emulate --hl HL8 -- torchrun --nproc-per-node 4 x.py") is None
    assert check_command("omnilearn fly --out x") is not None
    assert check_command("omnilearn run --no-such-flag") is not None


MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_make_targets_exist(page: Path) -> None:
    text = page.read_text()
    named = re.findall(r"\bmake ([a-z][\w-]*)", "\n".join(code_blocks(text) + inline_code(text)))
    assert set(named) <= MAKE_TARGETS, f"{rel(page)}: no make target {set(named) - MAKE_TARGETS}"


CONFIG_KEYS = {k for k, _, _ in docs_gen.config_keys()}


def named_keys(text: str) -> list[str]:
    code = "\n".join(code_blocks(text) + inline_code(text))
    # a call is no key, nor an attribute assigned in a script (`model.x = ...`)
    pattern = rf"(?<![\w./-])((?:{'|'.join(CONFIG_SECTIONS)})\.[a-z_]+)\b(?![./(])(?! = )"
    return [k for k in re.findall(pattern, code) if k.split(".")[1] not in ("py", "pt", "yaml", "json", "md", "sock")]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_config_keys_exist(page: Path) -> None:
    unknown = sorted(set(named_keys(page.read_text())) - CONFIG_KEYS)
    assert not unknown, f"{rel(page)}: no config key {unknown}"


def test_path_and_key_checks_can_fail() -> None:
    assert named_paths("see `emulator/no_such.py` and configs/nothing.yaml") == [
        "configs/nothing.yaml", "pytorch/omnilearn/emulator/no_such.py"]
    assert named_keys("`control.no_such_key` and `train.lr`") == ["control.no_such_key", "train.lr"]
    assert named_keys("`model.eval()` and `model.name`") == ["model.name"]  # a method of a model is no key


def test_figure_check_can_fail() -> None:
    unlinked, linked = "## A\n\nIt ran 1.48× faster.\n", "## A\n\n1.48× ([m](results/x.md)).\n"
    assert [bool(FIGURE.search(x)) for x in sections(unlinked)] == [False, True]
    assert re.search(r"\]\([./]*results/[\w.-]+\.md", sections(linked)[1])


# ---------------------------------------------------------------- the run folder


def test_every_audit_status_is_in_the_run_folder_reference() -> None:
    """(The record kinds: tests/unit/test_records.py and the generated docs/reference/records.md.)"""
    text = (ROOT / "docs" / "reference" / "run-folder.md").read_text()
    statuses = {"applying", *ACK_STATUSES}
    missing = sorted(s for s in statuses if f"| `{s}` |" not in text)
    assert not missing, f"audit statuses missing from run-folder.md: {missing}"


# ---------------------------------------------------------------- figures and results

FIGURE = re.compile(r"\d+\.\d+ ?(×|x\b)|± ?\d|\b\d+(\.\d+)? ?(s|ms|min) (of wall|mean|against)|\d+% of the ideal")


def sections(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", lambda m: m.group(0).replace("#", ""), text, flags=re.M | re.S)
    return re.split(r"^#{1,3} ", text, flags=re.M)


@pytest.mark.parametrize("page", GUIDE, ids=rel)
def test_quoted_figures_link_their_results(page: Path) -> None:
    for section in sections(page.read_text()):
        if FIGURE.search(section):
            assert re.search(r"\]\([./]*results/[\w.-]+\.md", section), (
                f"{rel(page)}: section {section.splitlines()[0]!r} quotes a figure "
                f"({FIGURE.search(section).group(0)!r}) and links no results file")


@pytest.mark.parametrize("path", [p for p in RESULTS if p.name != "README.md"], ids=rel)
def test_results_files_hold_commit_host_and_command(path: Path) -> None:
    assert re.match(r"\d{4}-\d{2}-\d{2}_[\w-]+\.md$", path.name)
    text = path.read_text()
    assert re.search(r"\*\*Commits?:?\*\*|\*\*Dates and commits:\*\*", text), path.name
    assert "**Host:**" in text, path.name
    assert re.search(r"^Commands?\b.*:$|^Command: `", text, flags=re.M) and "```" in text or "Command: `" in text, path.name


def test_every_results_file_is_listed() -> None:
    index = (ROOT / "results" / "README.md").read_text()
    unlisted = [p.name for p in RESULTS if p.name != "README.md" and f"({p.name})" not in index]
    assert not unlisted


# ---------------------------------------------------------------- the request protocol's limits


def limits_table() -> dict[str, list[str]]:
    """Row label -> cells of the limits table in docs/design/request-protocol.md."""
    text = (ROOT / "docs" / "design" / "request-protocol.md").read_text().split("## The limits", 1)[1]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    return {r[0]: r[1:] for r in rows[1:]}


def test_request_limits_match_the_code() -> None:
    from omnilearn.emulator.protocol import requests as rq

    table = limits_table()
    value = {k: v[0] for k, v in table.items()}
    assert value["line length, on the raw bytes, before decoding"] == f"{rq.MAX_LINE_BYTES} bytes"
    assert value["depth: one flat JSON object"] == str(rq.MAX_JSON_DEPTH)
    assert value["numbers: text length before conversion; `NaN`, `Infinity`, `-0`"] == (
        f"{rq.MAX_INT_DIGITS} characters") and rq.MAX_FLOAT_CHARS == rq.MAX_INT_DIGITS
    assert value["`seq`"] == "integer in [0, 2^53 − 1]" and rq.MAX_SEQ == 2**53 - 1
    assert value["`rank`"] == f"integer in [0, {rq.MAX_RANK}]"
    assert value["`level`, `target`"].startswith(f"1 to {rq.MAX_NAME_CHARS} printable characters")
    assert value["`cpuset`"].startswith(f"≤ {rq.MAX_CPUSET_CHARS} characters")
    assert f"each number ≤ {rq.MAX_CPU_DIGITS} digits" in value["`cpuset`"]
    assert value["`epoch`, `time`"] == "finite, in [0, 10^12]" and rq.MAX_STAMP == 1e12
    assert f"last + {rq.MAX_SEQ_STEP} " in value["`seq` step"]
    assert value["log size"] == f"{rq.MAX_LOG_BYTES // 2**20} MiB"
    assert value["refused lines per log"] == str(rq.MAX_REFUSALS_PER_LOG)
    assert value["reading per poll and log"] == f"{rq.MAX_READ_BYTES // 2**10} KiB, {rq.MAX_LINES_PER_POLL} lines"
    assert value["quoted values"].startswith(f"{rq.MAX_ECHO_CHARS} characters")


def test_refusal_reasons_match_the_code() -> None:
    """Every reason the parser raises is in the table, and every code the table names is in the code."""
    table = limits_table()
    documented = {code for cells in table.values() for code in re.findall(r"`([a-z]+(?:-[a-z0-9]+)*)`", cells[-1])}
    sources = "".join((PACKAGE / "emulator" / "protocol" / name).read_text() for name in ("requests.py", "toggler.py"))
    raised = set(re.findall(r'_Refused\(\s*"([a-z-]+)"', sources))
    assert raised and raised <= documented, f"reasons missing from the table: {sorted(raised - documented)}"
    literals = set(re.findall(r"\"([a-z]+(?:-[a-z0-9]+)*)\"", sources))
    if 'f"{key}-out-of-range"' in sources:  # _check_range names the key it bounds
        from omnilearn.emulator.protocol.requests import _FIELDS  # the format's keys

        literals |= {f"{key}-out-of-range" for key in _FIELDS}
    assert documented <= literals, f"the table names reasons the code lacks: {sorted(documented - literals)}"


def test_retry_constants_match_the_emulator_page() -> None:
    from omnilearn.emulator.protocol import retry

    text = (ROOT / "docs" / "design" / "emulator.md").read_text()
    assert f"is tried again after {retry.RETRY_FIRST_S} s." in text
    assert f"The wait doubles up to {retry.RETRY_CAP_S:g} s, for at most {retry.MAX_RETRIES} attempts" in text


def test_audit_limits_match_the_request_protocol_page() -> None:
    from omnilearn.emulator.protocol import requests as rq

    text = (ROOT / "docs" / "design" / "request-protocol.md").read_text()
    assert f"{rq.MAX_AUDIT_LINE_BYTES // 2**10} KiB a line, depth {rq.MAX_AUDIT_DEPTH}." in text
    assert f"at most {rq.MAX_STRAY_REPORTS} stray names" in text
    assert f"past {rq.MAX_LOG_BYTES // 2**20} MiB" in (ROOT / "docs" / "design" / "security.md").read_text()


def test_the_readmes_workload_builds_and_trains_a_step() -> None:
    import torch

    block = (ROOT / "README.md").read_text().split("```python\n# mine.py\n", 1)[1].split("```", 1)[0]
    space: dict = {}
    exec(compile(block, "README.md:mine.py", "exec"), space)  # noqa: S102 - the project's own README
    work = space["workload"](None)
    assert len(work.train) == 5120 and len(work.test) == 1024
    x, y = work.train[:1024]
    loss = torch.nn.functional.cross_entropy(work.model()(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    assert "--global-batch 1024 --hl HL8 --compare" in (ROOT / "README.md").read_text()
