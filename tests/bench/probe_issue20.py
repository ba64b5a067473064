"""The re-run probe of issue 20 ("Nothing lost, no one in"): every finding of the issue's list, and every case it
confirmed fixed, as a case that runs again and prints PASS or FAIL with what it measured.

    python tests/bench/probe_issue20.py                 # every case (about 10 minutes on 2 busy cores)
    python tests/bench/probe_issue20.py --only resume   # the cases whose name contains "resume"
    python tests/bench/probe_issue20.py --flood-rounds 0  # without the web flood (the slowest, noisiest case)
    python tests/bench/probe_issue20.py --markdown      # the table as docs/faults.md shows it

A case is the regression tests that reproduce its finding as the issue describes it and assert the expected
outcome (each runs the fault for real: processes killed, stopped, flooded; sockets fed hostile frames), run in a
pytest process of their own; its measurement is what those tests assert, with their outcome and time. The web
face's case runs ``tests/bench/bench_web_flood.py`` and measures the median flood / quiet round-time ratio
against the issue's <= 5%. "1,000 flat clients" is measured by ``tests/bench/bench_many_clients.py`` (see
scale). Not part of ``make test``: it re-runs tests of every tier, the testbed's (root) included.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    name: str
    finding: str  # the finding, short
    expected: str  # what the tests assert: the measurement a PASS stands for
    tests: tuple[str, ...] = ()  # pytest node ids (relative to the repository root)
    see: str = ""  # measured elsewhere (another branch's benchmark): not run here


I = "tests/integration/"
U = "tests/unit/"
N = "tests/net/"
T = "tests/testbed/"

CASES: tuple[Case, ...] = (
    # -- this week's findings -----------------------------------------------------------------------------
    Case("two-ps-one-folder", "a second `server --resume` on a running run folder ran beside the first",
         "refused at once, exit 2 naming the holder's pid, rounds.jsonl untouched; a dead holder's lock taken "
         "over with a log line", (I + "test_resume_network.py::test_launch_killed_and_resumed",)),
    Case("focus-client-without-state", "a FOCUS client restarted without its state: PS exit 1, clients 12, "
         "no model.pt", "the run goes on without it, missing.csv says `lost state`, exit 0 and model.pt",
         (I + "test_resume_network.py::test_client_back_without_its_state_is_left_out_and_said_so",
          I + "test_resume_network.py::test_client_back_without_its_state_alone_in_a_round_does_not_end_the_run")),
    Case("ps-sigstop", "the PS stalled (SIGSTOP) mid-round and continued: not followed to its end",
         "every process exits 0, every round recorded, rounds after the stall at most 3x + 0.5 s the ones before",
         (I + "test_ps_stall.py",)),
    Case("web-flood", "2,000 requests in 12 s: median round +14-22%; 100 event streams: +70%",
         "median round under the flood <= 1.05 x quiet (bench_web_flood.py, median of 3)"),
    Case("plaintext-trusted", "on plaintext a newcomer with a free id gets the RunSpec and the model",
         "every node says `links: insecure (plaintext...)` at start; under TLS a newcomer without a good "
         "certificate, or claiming another id, is refused (docs/security.md says what plaintext allows)",
         (U + "test_node_config.py", I + "test_security.py::test_peers_without_a_good_certificate_or_claiming_"
          "another_id_are_refused")),
    Case("headers-for-unsent-calls", "15 GiB bundle headers on never-sent call ids logged as accepted",
         "refused at once, their chunks dropped unread, nothing allocated",
         (U + "test_session_security.py::test_a_header_for_a_call_never_sent_is_refused_at_once_and_its_chunks_"
          "dropped", U + "test_session_security.py::test_a_header_for_a_closed_call_is_refused",
          U + "test_hostile_session.py::test_a_reply_to_a_call_never_sent_opens_no_bundle")),
    Case("session-hijack", "two Hellos take over a connected client on plaintext; a refusal reveals the run id",
         "no refusal names the run id; a second Hello for a connected id is refused whatever it carries",
         (U + "test_session_security.py::test_no_refusal_tells_a_newcomer_the_run_id",
          U + "test_session_security.py::test_a_second_hello_for_a_connected_id_is_refused_even_with_the_run_id",
          N + "test_session_takeover.py")),
    Case("self-declared-sizes", "n = 1e12 and a neighbour's size set to 1, under mutual TLS too",
         "a node declares only its own size, once, bounded; a change or another node's size is refused and logged",
         (U + "test_session_security.py::test_a_client_declares_only_its_own_size_once_and_bounded",
          U + "test_session_security.py::test_an_edge_declares_only_its_clusters_sizes",
          U + "test_rejoin_sizes.py",
          I + "test_security.py::test_a_client_claiming_another_data_size_is_rejected")),
    Case("edges-n0-rounds", "rounds in which no client trained counted as trained under edges (17 of 20)",
         "an n = 0 reply is not a usable one; the round is redone, then exit 1; missing.csv names the clients",
         (U + "test_participation_counts.py",)),
    Case("idle-streams", "200 idle streams without Hello keep a run from starting (exit 7) and block a Hello",
         "the run starts and a mid-run Hello is admitted while the streams are open",
         (N + "test_idle_sessions.py",
          I + "test_hostile_peers.py::test_idle_connections_forged_bundles_and_a_silent_client_do_not_stop_the_run")),
    Case("full-disk", "a full disk loses the trained model and leaves spec.toml at 0 bytes",
         "files whole or not at all; the model goes to a fedhop-<run>-... folder under $TMPDIR; exit 10",
         (U + "test_run_folder_disk.py", T + "test_disk.py")),
    Case("stall-mid-upload", "one participant stalling mid-upload stretches a round from 5 s to 35 s; a 512 MiB "
         "reply buffered before its shape is checked", "the round ends at its deadline with the staller missing; "
         "a header of the wrong shape fails the reply before its bytes are read",
         (N + "test_reply_stall.py", U + "test_header_expect.py")),
    Case("1000-flat-clients", "first round 610 s against a 300 s deadline, 2,035 PS threads", "",
         see="see scale (branch `scale`, tests/bench/bench_many_clients.py)"),
    Case("resume-finished-run", "resume of a finished run starts `at round 21 of 20` and exits 0",
         "exit 16 (ALREADY_FINISHED), `is finished: all 4 rounds are done`, no round started",
         (I + "test_resume_network.py::test_launch_killed_and_resumed",)),
    # -- confirmed fixed last week, kept ---------------------------------------------------------------------
    Case("ps-killed-resumed", "SIGKILLed PS resumed", "bit-identical model and payload bytes per link",
         (I + "test_resume_network.py::test_ps_killed_and_resumed_is_bit_identical",)),
    Case("fedchs-edge-killed", "active Fed-CHS edge killed", "the round redone at another edge; model never "
         "re-sent by the PS", (I + "test_resume_network.py::test_active_fedchs_edge_killed_the_round_is_redone_"
                               "elsewhere",)),
    Case("late-joiners", "late joiners", "admitted at a round boundary (or refused when the spec says so)",
         (I + "test_network_faults_rejoin.py",)),
    Case("focus-state-dir", "a FOCUS client restarted with its state-dir", "bit-identical; y = sum_i g_i",
         (I + "test_resume_network.py::test_client_restarted_with_its_state_dir_keeps_the_run_exact",)),
    Case("read-only-folder", "read-only / full run folders", "exit 10, says what was saved",
         (T + "test_disk.py::test_read_only_run_folder_mid_run",
          I + "test_network_faults_startup.py::test_unwritable_run_folder_stops_the_ps_before_its_port_opens")),
    Case("forged-handoffs", "forged hand-offs and squatters under TLS", "refused",
         (I + "test_security.py::test_hand_offs_and_describes_only_from_neighbours_certificates",)),
    Case("truncated-checkpoint", "a truncated checkpoint", "named, the previous one used, bit-identical",
         (I + "test_resume_network.py::test_resume_skips_a_truncated_checkpoint",)),
    Case("client-host-killed", "a SIGKILLed client host re-joins", "it restores its ids' state; the run ends "
         "(exit 0 everywhere): the chaos soak's FedAvg-through-edges run, whose schedule (seed 20) kills the host "
         "after round 1", (T + "test_chaos.py::test_chaos_soak[fedavg-edges]",)),
    Case("ctrl-c-launch", "Ctrl-C on launch", "exit 130, the rounds done written, nothing left running",
         (I + "test_cli_failures.py::test_ctrl_c_on_launch_writes_the_rounds_done",)),
    Case("malformed-replies", "malformed, mistyped, oversized and NaN replies", "rejected with the reason",
         (U + "test_engine_inprocess.py::test_nan_update_is_rejected_and_run_continues",
          U + "test_codec_frames.py::test_malformed_frame_is_a_codec_error",
          U + "test_hostile_session.py::test_open_bundles_and_bytes_in_flight_are_capped_per_peer")),
    # -- what the issue asks to build ------------------------------------------------------------------------
    Case("chaos-soak", "a chaos soak in CI", "Fed-CHS, FOCUS, FedAvg-through-edges under seeded kills / stops / "
         "restarts: invariants after every round, exit 0", (T + "test_chaos.py",)),
    Case("fuzzers", "fuzzing in CI", "0 crashes (hypothesis, CI's example counts)",
         (U + "test_fuzz_wire.py", U + "test_fuzz_session.py", U + "test_fuzz_web.py", U + "test_fuzz_spec.py")),
)


@dataclass(frozen=True)
class Outcome:
    ok: bool | None  # None: not run here
    measured: str
    seconds: float


def run_tests(case: Case, timeout_s: float) -> Outcome:
    """The case's tests in a pytest process of their own: PASS when every one passed (none skipped)."""
    with tempfile.TemporaryDirectory(prefix="probe20-") as tmp:
        xml = Path(tmp) / "junit.xml"
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                                   f"--junitxml={xml}", *case.tests], cwd=ROOT, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Outcome(False, f"timed out after {timeout_s:g} s", time.monotonic() - t0)
        took = time.monotonic() - t0
        if not xml.is_file():
            return Outcome(False, f"pytest exit {proc.returncode}: {proc.stdout[-300:]}", took)
        cases = ET.parse(xml).getroot().iter("testcase")
        passed, failed, skipped = 0, [], 0
        for tc in cases:
            bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            if bad is not None:
                failed.append(f"{tc.get('name')}: {(bad.get('message') or '').splitlines()[0][:200]}")
            elif tc.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    ok = not failed and not skipped and passed > 0 and proc.returncode == 0
    what = f"{passed} passed" + (f", {skipped} skipped" if skipped else "") + (f", FAILED {failed[0]}" if failed
                                                                                  else "")
    return Outcome(ok, what, took)


def run_flood(rounds: int, timeout_s: float) -> Outcome:
    """bench_web_flood.py: the median over three repetitions of the flood / quiet median round time."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "tests/bench/bench_web_flood.py"), "--rounds", str(rounds),
                               "--reps", "3", "--launch-reps", "0"], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Outcome(False, f"timed out after {timeout_s:g} s", time.monotonic() - t0)
    m = re.search(r"median of 3: quiet ([0-9.]+) s, flood ([0-9.]+) s, ratio ([0-9.]+).*?load average at the end "
                  r"([0-9. ]+)", proc.stdout)
    if m is None:
        return Outcome(False, f"no result (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-300:]}",
                       time.monotonic() - t0)
    ratio = float(m.group(3))
    cpu = re.search(r"server thread CPU ([0-9.]+)%", proc.stdout)
    return Outcome(ratio <= 1.05, f"round {m.group(1)} s quiet, {m.group(2)} s flooded: ratio {ratio:.3f}"
                   + (f"; the server thread used {cpu.group(1)}% of a core" if cpu else "")
                   + f"; load {m.group(4).strip()}", time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    ap.add_argument("--flood-rounds", type=int, default=150, help="rounds of the web flood's run (0: skip it)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args(argv)
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)",
          flush=True)
    rows: list[tuple[Case, Outcome]] = []
    for case in CASES:
        if args.only not in case.name:
            continue
        if case.see:
            out = Outcome(None, case.see, 0.0)
        elif case.name == "web-flood":
            out = run_flood(args.flood_rounds, args.timeout) if args.flood_rounds else Outcome(None, "skipped", 0.0)
        else:
            out = run_tests(case, args.timeout)
        rows.append((case, out))
        verdict = {True: "PASS", False: "FAIL", None: "----"}[out.ok]
        print(f"{verdict}  {case.name:28s} {out.seconds:6.0f}s  {out.measured}", flush=True)
    fails = [c.name for c, o in rows if o.ok is False]
    print(f"\n{sum(o.ok is True for _, o in rows)} PASS, {len(fails)} FAIL" + (f": {', '.join(fails)}" if fails else "")
          + f"; load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.markdown:
        print("\n| case | finding | expected (what the tests assert) | result | measured |")
        print("|---|---|---|---|---|")
        for c, o in rows:
            verdict = {True: "PASS", False: "**FAIL**", None: "see scale" if c.see else "not run"}[o.ok]
            print(f"| {c.name} | {c.finding} | {c.expected} | {verdict} | {o.measured} ({o.seconds:.0f} s) |")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
