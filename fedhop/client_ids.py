"""Client id lists of ``fedhop clients --ids``: ``client-0..client-9,client-12`` (ranges inclusive).

:func:`parse_ids` reads one (a :class:`IdListError` names the bad item), :func:`format_ids` writes a
compact one for given ids (``launch`` uses it for its client hosts' command lines and log names).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# launch's clients per client host by default: a process costs ~2 s of CPU to import torch, so a few hosts start far
# faster than one process per client, and 64 ids still spread a large run over several processes (and cores).
CLIENTS_PER_PROCESS = 64
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
