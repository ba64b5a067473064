"""Regenerate the committed Python stubs of ``proto/fedhop/v1/fedhop.proto`` with grpc_tools.protoc.

    python proto/generate.py            # rewrite fedhop_pb2.py, fedhop_pb2_grpc.py, fedhop_pb2.pyi
    python proto/generate.py --check    # exit 1 with a diff when the committed stubs are stale

The stubs import as ``fedhop.v1.fedhop_pb2`` (setup.py maps ``fedhop.v1`` onto ``proto/fedhop/v1``), which
is why protoc runs with ``proto/`` as its include root. The comparison ignores only the lines that name the
generator's version (the protobuf/grpc versions the stubs were made with), so a newer grpcio-tools that
produces the same code does not count as stale, while any change of the schema does.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILE = Path("fedhop/v1/fedhop.proto")  # relative to PROTO_ROOT (protoc's include root)
STUBS = ("fedhop_pb2.py", "fedhop_pb2_grpc.py", "fedhop_pb2.pyi")

_VERSION_LINES = [
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: <masked>"),
    (
        re.compile(r"(ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,)\s*\d+,\s*\d+,\s*\d+,"),
        r"\1 <masked>,",
    ),
    (re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M), "GRPC_GENERATED_VERSION = <masked>"),
]


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc on ``proto_root/fedhop/v1/fedhop.proto``; write the stubs under ``out_root/fedhop/v1``."""
    import grpc_tools
    from grpc_tools import protoc

    out_root.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--pyi_out={out_root}",
        str(proto_root / PROTO_FILE),
    ]
    rc = protoc.main(argv)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(argv)}")
    return [out_root / PROTO_FILE.parent / name for name in STUBS]


def normalized(text: str) -> str:
    """The stub text with the generator-version lines masked."""
    for pattern, repl in _VERSION_LINES:
        text = pattern.sub(repl, text)
    return text


def stale(committed_dir: Path, fresh_dir: Path) -> list[str]:
    """Unified diffs (one per differing stub) between committed and freshly generated stubs; [] if none."""
    diffs = []
    for name in STUBS:
        committed, fresh = committed_dir / name, fresh_dir / name
        old = normalized(committed.read_text()) if committed.exists() else ""
        new = normalized(fresh.read_text())
        if old != new:
            diff = difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"committed/{name}", tofile=f"generated/{name}", n=1,
            )
            diffs.append("".join(diff) or f"{name}: missing\n")
    return diffs


def check(proto_root: Path = PROTO_ROOT) -> list[str]:
    """Regenerate into a temporary folder and compare with the stubs committed beside the .proto."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), proto_root)
        return stale(proto_root / PROTO_FILE.parent, Path(tmp) / PROTO_FILE.parent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        diffs = check()
        for d in diffs:
            sys.stdout.write(d)
        print("stubs are stale: run python proto/generate.py" if diffs else "stubs are up to date")
        return 1 if diffs else 0
    for path in generate(PROTO_ROOT):
        print(f"wrote {path.relative_to(PROTO_ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
