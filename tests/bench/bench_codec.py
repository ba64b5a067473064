"""Benchmark of the chunked tensor codec (common/wire/codec.py, common/wire/frames.py). Prints tables.

    .venv/bin/python tests/bench/bench_codec.py            # 1 MB and 100 MB bundles; RSS test at 100 MB
    .venv/bin/python tests/bench/bench_codec.py --full     # adds 1 GB bundles; RSS test at 1 GB

1. Throughput of encode + decode (payload bytes / wall time and / CPU time, best of --reps), beside plain
   memory copies of the same tensor in the same run, taking turns with them. Each decode allocates its
   buffer afresh, as a receiver does, so the fair baselines are ``torch.clone`` (allocate + copy, with
   torch's intra-op threads) and ``bytearray`` (allocate + copy, one thread, like the codec);
   ``copy_`` into a warm buffer is shown as an upper bound. Paths:
     views      encode_views() -> RawChunk views of the tensors -> BundleDecoder (the codec's own work:
                checksums, chunking, header, decode into one buffer; what frames.bundle_frames builds on)
     codec      encode() -> pb.Chunk objects -> BundleDecoder (the codec API, no serialization; protobuf
                copies each chunk's bytes in and out of the message)
     raw        bundle_frames(raw=True) -> serialized Frame bytes -> parse_frame -> BundleDecoder
                (what a gRPC stream with frames.serialize_frame / parse_frame does)
     protobuf   bundle_frames(raw=False) -> SerializeToString -> ParseFromString -> BundleDecoder
                (what a gRPC stream with the generated stubs' default serializers does)
   with the default checksum (xxh3_64) and, for comparison, crc32 and none on the raw path.
   ``--baseline-rev REV`` adds the views, codec and raw paths of codec.py + frames.py as of git revision REV,
   loaded beside the working tree's, so that before and after are measured in the same run.
2. Message bytes / payload bytes: serialized sizes of the header frame and all chunk frames (``ByteSize()``,
   equal to the raw frames' lengths) over the raw tensor bytes.
3. Peak RSS of sending one bundle between two processes over a pipe (length-prefixed serialized frames):
   the sender builds the bundle and streams its frames; the receiver decodes them and checks the checksum.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import os
import resource
import struct
import subprocess
import sys
import time
import types
from collections.abc import Callable

import torch

from fedhop.common.wire import codec, frames
from fedhop.common.wire.codec import BundleDecoder
from fedhop.common.wire.frames import ChunkFrame

MB = 1_000_000
SIZES = {"1MB": MB, "100MB": 100 * MB, "1GB": 1000 * MB}


def make_bundle(nbytes: int, tensors: int = 1) -> dict[str, torch.Tensor]:
    """float32 tensors adding up to ``nbytes`` (rounded to whole floats), filled with varied values."""
    per = nbytes // 4 // tensors
    out = {}
    for i in range(tensors):
        n = per if i < tensors - 1 else nbytes // 4 - per * (tensors - 1)
        out[f"layer{i}.weight"] = torch.empty(n, dtype=torch.float32).uniform_(-1, 1, generator=None)
    return out


def best_times(paths: list[tuple[str, Callable[[], object]]], reps: int) -> list[tuple[float, float]]:
    """Best (wall, CPU) seconds per path. The paths take turns within each rep, so that a machine whose load
    changes during the run slows baselines and codec alike; CPU time (this process, all threads, system
    time included) is the steadier measure on a shared machine."""
    best = [(float("inf"), float("inf"))] * len(paths)
    for _ in range(reps):
        for i, (_, fn) in enumerate(paths):
            gc.collect()
            w0, c0 = time.perf_counter(), time.process_time()
            result = fn()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            del result
            best[i] = (min(best[i][0], wall), min(best[i][1], cpu))
    return best


def via_views(bundle: dict[str, torch.Tensor], chunk_bytes: int, codec_mod=codec) -> dict[str, torch.Tensor]:
    header, chunks = codec_mod.encode_views(bundle, chunk_bytes)
    decoder = codec_mod.BundleDecoder(header)
    for c in chunks:
        decoder.feed(c)
    return decoder.finish()


def via_codec(bundle: dict[str, torch.Tensor], chunk_bytes: int, codec_mod=codec) -> dict[str, torch.Tensor]:
    header, chunks = codec_mod.encode(bundle, chunk_bytes)
    decoder = codec_mod.BundleDecoder(header)
    for c in chunks:
        decoder.feed(c)
    return decoder.finish()


def via_frames(bundle, chunk_bytes: int, raw: bool, checksum: str = codec.DEFAULT_CHECKSUM, meter=None,
               frames_mod=frames):
    stream = frames_mod.bundle_frames(1, bundle, chunk_bytes, raw=raw, checksum=checksum)
    decoder = None
    for frame in stream:
        wire = frames_mod.serialize_frame(frame)
        if meter is not None:
            meter.append(frames_mod.frame_size(frame))
        got = frames_mod.parse_frame(wire)
        if isinstance(got, frames_mod.ChunkFrame):
            decoder.feed(got)
        elif got.WhichOneof("body") == "header":
            decoder = frames_mod.codec.BundleDecoder(got.header)
        else:
            decoder.feed(got.chunk)
    return decoder.finish()


def load_revision(rev: str) -> tuple[types.ModuleType, types.ModuleType]:
    """codec.py and frames.py as of git revision ``rev``, as modules beside the working tree's."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def source(path: str) -> str:
        return subprocess.run(["git", "-C", root, "show", f"{rev}:{path}"], check=True, capture_output=True,
                              text=True).stdout

    mods = []
    for name, path in (("codec", "common/wire/codec.py"), ("frames", "common/wire/frames.py")):
        mod = types.ModuleType(f"_baseline_{name}")
        sys.modules[mod.__name__] = mod  # dataclasses look their module up
        text = source(path).replace("from fedhop.common.wire.codec import", "from _baseline_codec import")
        exec(compile(text, f"{rev}:{path}", "exec"), mod.__dict__)
        mods.append(mod)
    mods[1].codec = mods[0]
    return mods[0], mods[1]


frames.codec = codec  # via_frames finds the decoder next to the frames module it is given


def codec_paths(bundle: dict[str, torch.Tensor], chunk_bytes: int, baseline: tuple | None = None,
                rev: str = "") -> list[tuple[str, Callable[[], object]]]:
    x = next(iter(bundle.values()))
    warm = torch.empty_like(x)
    paths = [
        ("copy: torch.clone (alloc+copy)", lambda: x.clone()),
        ("copy: bytearray(memoryview)", lambda: bytearray(memoryview(x.numpy()))),
        ("copy: copy_ into warm buffer", lambda: warm.copy_(x)),
        ("views  xxh3_64 (encode_views)", lambda: via_views(bundle, chunk_bytes)),
        ("codec  xxh3_64 (pb.Chunk API)", lambda: via_codec(bundle, chunk_bytes)),
        ("raw    xxh3_64", lambda: via_frames(bundle, chunk_bytes, True)),
        ("raw    crc32", lambda: via_frames(bundle, chunk_bytes, True, "crc32")),
        ("raw    none", lambda: via_frames(bundle, chunk_bytes, True, "none")),
        ("protobuf xxh3_64", lambda: via_frames(bundle, chunk_bytes, False)),
    ]
    if baseline is not None:
        old_codec, old_frames = baseline
        paths += [
            (f"{rev}: views  xxh3_64", lambda: via_views(bundle, chunk_bytes, old_codec)),
            (f"{rev}: codec  xxh3_64", lambda: via_codec(bundle, chunk_bytes, old_codec)),
            (f"{rev}: raw    xxh3_64", lambda: via_frames(bundle, chunk_bytes, True, frames_mod=old_frames)),
        ]
    return paths


def throughput_table(sizes: list[str], chunk_bytes: int, reps: int, baseline_rev: str | None = None
                     ) -> list[dict]:
    rows = []
    baseline = load_revision(baseline_rev) if baseline_rev else None
    for label in sizes:
        nbytes = SIZES[label]
        r = reps * 10 if nbytes <= MB else reps if nbytes <= 100 * MB else max(2, reps - 1)
        bundle = make_bundle(nbytes)
        paths = codec_paths(bundle, chunk_bytes, baseline, baseline_rev or "")
        for _, fn in paths[3:]:  # every codec path decodes correctly, once
            out = fn()
            assert isinstance(out, dict) and all(torch.equal(out[k], v) for k, v in bundle.items())
            del out
        times = best_times(paths, r)
        wall = [nbytes / w / 1e9 for w, _ in times]
        cpu = [nbytes / c / 1e9 for _, c in times]
        for (name, _), w, c in zip(paths, wall, cpu, strict=True):
            rows.append({"size": label, "path": name, "GB/s": w, "vs clone": w / wall[0],
                         "vs bytearray": w / wall[1], "GB/CPU-s": c, "CPU vs clone": c / cpu[0],
                         "CPU vs bytearray": c / cpu[1]})
        del bundle, paths
        gc.collect()
    return rows


def overhead_table(sizes: list[str], chunk_bytes: int) -> list[dict]:
    rows = []
    for label in sizes:
        for tensors in (1, 100):
            nbytes = SIZES[label]
            bundle = make_bundle(nbytes, tensors)
            payload = sum(t.numel() * t.element_size() for t in bundle.values())
            sizes_ = []
            via_frames(bundle, chunk_bytes, True, meter=sizes_)
            plain = []
            via_frames(bundle, chunk_bytes, False, meter=plain)
            assert sum(plain) == sum(sizes_)
            rows.append({"size": label, "tensors": tensors, "frames": len(sizes_), "payload B": payload,
                         "message B": sum(sizes_), "header B": sizes_[0], "ratio": sum(sizes_) / payload})
            del bundle
    return rows


# -- two processes ------------------------------------------------------------------------------------------


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise KeyError(field)


def _rss_now() -> int:
    return _proc_status("VmRSS")


def _peak_rss() -> int:
    """Peak RSS of this process image. Not getrusage's ru_maxrss: Linux carries that over exec from the
    parent, so a child of a big benchmark process would report the parent's peak."""
    try:
        return _proc_status("VmHWM")
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def role_send(nbytes: int, chunk_bytes: int) -> None:
    base = _rss_now()
    bundle = make_bundle(nbytes)
    out = sys.stdout.buffer
    t0 = time.perf_counter()
    sent = 0
    for frame in frames.bundle_frames(1, bundle, chunk_bytes):
        wire = frames.serialize_frame(frame)
        out.write(struct.pack("<I", len(wire)))
        out.write(wire)
        sent += len(wire)
    out.flush()
    elapsed = time.perf_counter() - t0
    print(json.dumps({"role": "send", "base_rss": base, "peak_rss": _peak_rss(), "message_bytes": sent,
                      "seconds": elapsed}), file=sys.stderr, flush=True)


def _read_exact(f, n: int) -> bytes:
    buf = f.read(n)
    if len(buf) != n:
        raise EOFError(f"stream ended after {len(buf)} of {n} bytes")
    return buf


def role_recv() -> None:
    base = _rss_now()
    inp = sys.stdin.buffer
    decoder = None
    t0 = None
    while decoder is None or not decoder.complete:
        (n,) = struct.unpack("<I", _read_exact(inp, 4))
        got = frames.parse_frame(_read_exact(inp, n))
        if t0 is None:
            t0 = time.perf_counter()
        if isinstance(got, ChunkFrame):
            decoder.feed(got)
        else:
            decoder = BundleDecoder(got.header)
    bundle = decoder.finish()  # verifies the checksum
    elapsed = time.perf_counter() - t0
    payload = sum(t.numel() * t.element_size() for t in bundle.values())
    print(json.dumps({"role": "recv", "base_rss": base, "peak_rss": _peak_rss(), "payload": payload,
                      "seconds": elapsed}), flush=True)


def two_process_rss(nbytes: int, chunk_bytes: int) -> dict:
    me = [sys.executable, os.path.abspath(__file__), "--chunk-bytes", str(chunk_bytes)]
    t0 = time.perf_counter()
    sender = subprocess.Popen([*me, "--role", "send", "--bytes", str(nbytes)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert sender.stdout is not None
    with contextlib.suppress(OSError):  # Linux: a 1 MiB pipe instead of 64 KiB, fewer context switches
        fcntl.fcntl(sender.stdout.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ
    receiver = subprocess.Popen([*me, "--role", "recv"], stdin=sender.stdout, stdout=subprocess.PIPE)
    sender.stdout.close()
    recv_out, _ = receiver.communicate()
    _, send_err = sender.communicate()
    wall = time.perf_counter() - t0
    if sender.returncode or receiver.returncode:
        rcs = f"send rc={sender.returncode} recv rc={receiver.returncode}"
        raise RuntimeError(f"{rcs}: {send_err.decode()}")
    send = json.loads(send_err.decode().strip().splitlines()[-1])
    recv = json.loads(recv_out.decode().strip().splitlines()[-1])
    return {"bundle": nbytes, "send": send, "recv": recv, "wall": wall}


# -- output -----------------------------------------------------------------------------------------------


def print_table(title: str, rows: list[dict], fmt: dict[str, str]) -> None:
    print(f"\n{title}")
    cols = list(rows[0])
    cells = [[format(r[c], fmt.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        pairs = enumerate(zip(row, widths, strict=True))
        print("  ".join(v.ljust(w) if i == 1 else v.rjust(w) for i, (v, w) in pairs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="include the 1 GB bundles (needs about 6 GB of RAM)")
    p.add_argument("--sizes", help="comma list of 1MB,100MB,1GB (overrides --full for the throughput tables)")
    p.add_argument("--chunk-bytes", type=int, default=codec.DEFAULT_CHUNK_BYTES)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-rss", action="store_true", help="skip the two-process RSS measurement")
    p.add_argument("--baseline-rev", metavar="REV",
                   help="also time codec.py + frames.py as of this git revision, in the same run")
    p.add_argument("--role", choices=["send", "recv"], help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "send":
        return role_send(args.bytes, args.chunk_bytes)
    if args.role == "recv":
        return role_recv()

    sizes = ["1MB", "100MB", "1GB"] if args.full else ["1MB", "100MB"]
    sizes = args.sizes.split(",") if args.sizes else sizes
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}, "
          f"chunk_bytes {args.chunk_bytes}, best of {args.reps} (x10 at 1 MB), load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    rows = throughput_table(sizes, args.chunk_bytes, args.reps, args.baseline_rev)
    print_table("1. encode + decode throughput (payload GB/s, best of reps; vs X = fraction of X's rate)",
                rows, {"GB/s": ".2f", "vs clone": ".0%", "vs bytearray": ".0%", "GB/CPU-s": ".2f",
                       "CPU vs clone": ".0%", "CPU vs bytearray": ".0%"})
    print_table("2. message bytes / payload bytes (header + chunk frames, serialized)",
                overhead_table(sizes, args.chunk_bytes), {"ratio": ".6f"})
    if not args.no_rss:
        nbytes = SIZES["1GB"] if args.full else SIZES["100MB"]
        r = two_process_rss(nbytes, args.chunk_bytes)
        rss_rows = []
        for side in ("send", "recv"):
            s = r[side]
            rss_rows.append({
                "process": side, "bundle MB": nbytes / MB, "RSS after imports MB": s["base_rss"] / MB,
                "peak RSS MB": s["peak_rss"] / MB, "peak / bundle": s["peak_rss"] / nbytes,
                "(peak - imports) / bundle": (s["peak_rss"] - s["base_rss"]) / nbytes,
                "seconds": s["seconds"],
            })
        print_table(f"3. two processes over a pipe, one {nbytes / MB:.0f} MB bundle (peak = VmHWM; seconds: "
                    "first frame to last, per side)",
                    rss_rows, {"bundle MB": ".0f", "RSS after imports MB": ".0f", "peak RSS MB": ".0f",
                               "peak / bundle": ".2f", "(peak - imports) / bundle": ".2f", "seconds": ".2f"})


if __name__ == "__main__":
    main()
