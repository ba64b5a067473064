"""The claims an experiment checks, when ``--only`` may have left out some of its runs."""

from __future__ import annotations

from collections.abc import Callable

from fedhop.reproduce.runner import current


class Claims:
    """``add(text, check)`` evaluates ``check()`` at once. With ``--only``, a claim whose check looks up a run that
    was left out (a KeyError from the experiment's table of runs) is listed as not checked; without ``--only``
    every run is there and any error propagates."""

    def __init__(self) -> None:
        self.checks: dict[str, bool] = {}
        self.unchecked: list[str] = []

    def add(self, text: str, check: Callable[[], bool]) -> None:
        if not current().only:
            self.checks[text] = bool(check())
            return
        try:
            self.checks[text] = bool(check())
        except KeyError:
            self.unchecked.append(text)

    def results(self) -> dict[str, bool]:
        return dict(self.checks)

    def notes(self, left_out: list[str]) -> list[str]:
        """The outcome's note on what ``--only`` left out (none without it)."""
        if not left_out:
            return []
        shown = ", ".join(left_out[:6]) + (" ..." if len(left_out) > 6 else "")
        return [f"--only {' '.join(current().only)}: {len(left_out)} run(s) left out ({shown}); "
                f"{len(self.unchecked)} claim(s) not checked: " + "; ".join(self.unchecked)]
