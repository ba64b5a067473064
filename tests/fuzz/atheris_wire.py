"""Coverage-guided fuzzing of the wire with atheris (optional: ``pip install atheris``; ``make fuzz`` runs it
when it is installed, after the hypothesis properties of tests/unit/test_fuzz_wire.py).

One input is split into frames (a length byte, then that many bytes); every frame goes through
``parse_frame_lenient`` and a ``MessageAssembler``, whose only allowed exception is ``FrameError``. Any other
exception is a crash that atheris reports with the input that caused it (saved as ``crash-*`` in the
working folder). Run: ``python tests/fuzz/atheris_wire.py --seeds CORPUS`` once (valid messages to start
from), then ``python tests/fuzz/atheris_wire.py CORPUS -runs=100000`` (libFuzzer flags).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import atheris
import torch  # imported first, uninstrumented: only fedhop's wire modules are

with atheris.instrument_imports(include=["fedhop"]):
    from fedhop.common.wire.frames import (
        FrameError,
        MessageAssembler,
        bundle_frames,
        parse_frame_lenient,
        result_frame,
        serialize_frame,
        task_frame,
    )

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


def write_seeds(folder: Path) -> None:
    """Valid streams (a Task or a Result with a small bundle, in this file's length-prefixed framing)."""
    folder.mkdir(parents=True, exist_ok=True)
    bundle = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.int64)}
    heads = [task_frame(1 << 56, "fedavg.train", {"lr": 0.1}, deadline_s=5.0, has_bundle=True, round_idx=1),
             result_frame(1 << 56, {"n": 3}, has_bundle=True)]
    for i, head in enumerate(heads):
        frames = [serialize_frame(head), *(serialize_frame(f) for f in bundle_frames(1 << 56, bundle, 16))]
        assert all(len(f) < 256 for f in frames)
        (folder / f"seed-{i}").write_bytes(b"".join(bytes([len(f)]) + f for f in frames))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        write_seeds(Path(sys.argv[2]))
        sys.exit(0)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
