"""How a job's failure is told: which worker failed first, and the end of its log."""

from __future__ import annotations

from pathlib import Path


class WorkerFailed(Exception):
    """A worker (process or container) ended with an error; the message names it and holds its log's end."""

    restartable = True
    """Whether ``fault.max_restarts`` may start the job again at once (not when what runs the workers is gone)."""

    def __init__(self, message: str, slot: int | None = None, gone: list[int] | None = None) -> None:
        super().__init__(message)
        self.slot = slot
        """The failed worker's index in the plan's targets (:attr:`~omnilearn.jobfile.JobSpec.slots`), when known."""
        self.gone = list(gone or [])
        """Workers (slots) known not to come back (their host's daemon is gone): a restart goes on without them."""


def first_failure(failures: dict[int, tuple[float, int]], user_error: int = 2) -> int:
    """The rank whose failure started it all, from ``{rank: (when, exit status)}``.

    When one worker dies, its peers fail a moment later on the broken connection, often before the
    launcher looks again: the earliest time wins; failures seen together are ordered by kind (killed
    by a signal, then a user error, then any other status: the peers' consequence errors), then rank.
    Signal deaths are negative statuses (``Popen``) or 128 + signal (containers).
    """
    def kind(status: int) -> int:
        return 0 if status < 0 or status > 128 else 1 if status == user_error else 2

    return min(failures, key=lambda r: (failures[r][0], kind(failures[r][1]), r))



def last_error(path: Path) -> str:
    """The ``omnilearn: error: ...`` line a worker printed before exiting with status 2."""
    for line in reversed(tail(path, 40).splitlines()):
        if line.startswith("omnilearn: error: "):
            return line.removeprefix("omnilearn: error: ")
    return f"exited with status 2 (see {path})"


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
