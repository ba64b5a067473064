"""Coverage-guided fuzzing of the wire with atheris (optional: ``pip install atheris``; ``make fuzz`` runs it
when it is installed, after the hypothesis properties of tests/unit/test_fuzz_wire.py).

One input is split into frames (a length byte, then that many bytes); every frame goes through
``parse_frame_lenient`` and a ``MessageAssembler``, whose only allowed exception is ``FrameError``. Any other
exception is a crash that atheris reports with the input that caused it (saved as ``crash-*`` in the
working folder). Run: ``python tests/fuzz/atheris_wire.py -runs=100000`` (libFuzzer flags).
"""

from __future__ import annotations

import contextlib
import sys

import atheris
import torch  # noqa: F401  (imported first, uninstrumented: only fedhop's wire modules are)

with atheris.instrument_imports(include=["fedhop"]):
    from fedhop.common.wire.frames import FrameError, MessageAssembler, parse_frame_lenient

MAX_BYTES = 1 << 16


def frames_of(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = data[i]
        out.append(data[i + 1:i + 1 + n])
        i += 1 + n
    return out


def one_input(data: bytes) -> None:
    asm = MessageAssembler(max_bytes=MAX_BYTES)
    for buf in frames_of(data):
        frame = parse_frame_lenient(buf)
        with contextlib.suppress(FrameError):  # the one exception the assembler may raise
            asm.feed(frame)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
