"""Client id lists of ``fedhop clients --ids``: ``client-0..client-9,client-12`` (ranges inclusive).

:func:`parse_ids` reads one (a :class:`IdListError` names the bad item), :func:`format_ids` writes a
compact one for given ids (``launch`` uses it for its client hosts' command lines and log names).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Sequence

AUTO = "auto"
MIN_AUTO_PER_PROCESS = 16
PREFIX = "client-"
_ID = re.compile(r"client-(0|[1-9][0-9]*)")


class IdListError(ValueError):
    """A client id list that cannot be read; the message names the item and what is wrong with it."""


def _ordinal(text: str, item: str) -> int:
    m = _ID.fullmatch(text)
    if m is None:
        raise IdListError(f"{text!r} in {item!r} is not a client id: client ids are client-<k> with k = 0, 1, 2, "
                          "... (no leading zeros)")
    return int(m.group(1))


def parse_ids(text: str) -> list[str]:
    """The ids of a list such as ``client-0..client-9,client-12``, in the order given: comma-separated items,
    each an id or an inclusive range ``client-A..client-B`` with A <= B. Empty items, ids that are not
    ``client-<k>``, backward ranges and ids listed twice are errors."""
    if not text.strip():
        raise IdListError("no client ids given (e.g. client-0..client-9,client-12)")
    out: list[str] = []
    seen: set[int] = set()
    for item in (i.strip() for i in text.split(",")):
        if not item:
            raise IdListError(f"empty item in the id list {text!r} (a stray comma?)")
        if ".." in item:
            lo_text, _, hi_text = item.partition("..")
            lo, hi = _ordinal(lo_text.strip(), item), _ordinal(hi_text.strip(), item)
            if lo > hi:
                raise IdListError(f"range {item!r} runs backwards: write client-{hi}..client-{lo}")
            ks = range(lo, hi + 1)
        else:
            ks = range(_ordinal(item, item), _ordinal(item, item) + 1)
        for k in ks:
            if k in seen:
                raise IdListError(f"{PREFIX}{k} is listed twice in {text!r}")
            seen.add(k)
            out.append(f"{PREFIX}{k}")
    return out


def format_ids(ids: Sequence[str]) -> str:
    """A compact list that :func:`parse_ids` reads back as ``ids``: runs of consecutive ids become ranges."""
    ks = [_ordinal(i, i) for i in ids]
    if not ks:
        raise IdListError("no client ids to format")
    items: list[str] = []
    start = prev = ks[0]
    for k in [*ks[1:], None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        items.append(f"{PREFIX}{start}" if start == prev else f"{PREFIX}{start}..{PREFIX}{prev}")
        if k is not None:
            start = prev = k
    return ",".join(items)


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_per_process(choice: int | str, clients: int) -> int:
    """``launch --clients-per-process``: a number, or ``auto`` = ``ceil(clients / cores)``, at least 16.

    A host runs one task at a time (one core) and a process costs ~2 s of CPU and ~250 MB to import torch, so
    about one host per core trains on every core while starting and holding as few processes as that allows;
    the floor of 16 keeps small runs in one host per parent on any machine."""
    if choice == AUTO:
        return max(MIN_AUTO_PER_PROCESS, math.ceil(clients / cores()))
    k = int(choice)
    if k < 1:
        raise ValueError(f"--clients-per-process must be >= 1 or auto, got {k}")
    return k


def per_process_arg(text: str) -> int | str:
    """argparse type of ``--clients-per-process``: ``auto`` or a positive integer."""
    if text == AUTO:
        return AUTO
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'auto'") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 or auto, got {k}")
    return k
