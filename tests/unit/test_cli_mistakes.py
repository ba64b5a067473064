"""A new user's mistakes on the command line, as a table: each ends with its exit code (2, USAGE, for every
mistake of the command line or spec), exactly one line on stderr that names the mistake (with a "did you mean"
where a known name is close), nothing on stdout, no traceback, and nothing left running.

Driven in-process through ``fedhop.cli.app.main`` (the same parser, handlers and error mapping as the console
script; the few that must be real processes, a broken pipe among them, are in
tests/integration/test_cli_mistakes.py). Also here: the hints themselves (cli/suggest.py), the summary's units
and link-class subtotals, and the progress bar on the run's clock.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psutil
import pytest

from fedhop.cli.app import main
from fedhop.common.exit_codes import ExitCode

USAGE = int(ExitCode.USAGE)

# (command line, exit code, what the one line on stderr must contain); {tmp}: a fresh folder, {spec}: a valid
# spec file in it, {bad_toml}: a file that is no TOML, {typo}: a spec with misspelt keys, {full}: a folder holding
# a file, {empty}: an empty folder
MISTAKES: list[tuple[str, int, str]] = [
    # commands
    ("", USAGE, "fedhop: the following arguments are required: COMMAND"),
    ("lanch", USAGE, "unknown command 'lanch' (commands: simulate,"),
    ("lanch", USAGE, "did you mean 'launch'?"),
    ("simulte", USAGE, "did you mean 'simulate'?"),
    ("algoritms", USAGE, "did you mean 'algorithms'?"),
    ("certs inti", USAGE, "fedhop certs: unknown command 'inti' (commands: init, add); did you mean 'init'?"),
    ("testbed upp", USAGE, "did you mean 'up'?"),
    ("--verison", USAGE, "fedhop: unrecognized arguments: --verison; did you mean --version?"),
    # options of a command, and spec fields given as options
    ("launch --rounds 5", USAGE, "fedhop launch: unrecognized arguments: --rounds; did you mean --set rounds=5?"),
    ("simulate --rounds=3", USAGE, "did you mean --set rounds=3?"),
    ("launch --clients 12", USAGE, "did you mean --set topology.clients=12?"),
    ("server --edges 3", USAGE, "did you mean --set topology.edges=3?"),
    ("simulate --lr 0.1", USAGE, "did you mean --set algorithm.options.lr=0.1?"),
    ("simulate --local-steps 4", USAGE, "did you mean --set algorithm.options.local_steps=4?"),
    ("simulate --round 4", USAGE, "did you mean --set rounds=4?"),
    ("spec --seed 3", USAGE, "did you mean --set seed=3?"),
    ("spec --data-path /data", USAGE, "did you mean --set data.path=/data?"),
    ("simulate --quite", USAGE, "fedhop simulate: unrecognized arguments: --quite; did you mean --quiet?"),
    ("launch --devcie cpu", USAGE, "did you mean --device?"),
    ("edge --idd edge-0 --connect 127.0.0.1:1", USAGE, "required: --id; unrecognized arguments: --idd; did you "
                                                       "mean --id?"),
    ("tokens init --out {tmp}/t.toml --frce", USAGE, "did you mean --force?"),
    ("algorithms extra", USAGE, "fedhop algorithms: unrecognized arguments: extra"),
    ("spec {spec} {spec}", USAGE, "unrecognized arguments: "),
    # missing or malformed values
    ("edge --id edge-0", USAGE, "fedhop edge: the following arguments are required: --connect"),
    ("client --connect 127.0.0.1:1", USAGE, "the following arguments are required: --id"),
    ("certs init", USAGE, "fedhop certs init: the following arguments are required: --out"),
    ("compare", USAGE, "the following arguments are required: RUN_DIR"),
    ("compare {empty} --target-accuracy high", USAGE, "argument --target-accuracy/--target: invalid float value: "
                                                      "'high'"),
    ("compare {empty} --goal maxx", USAGE, "invalid choice 'maxx' (choose from max, min); did you mean 'max'?"),
    ("simulate --set", USAGE, "argument --set: expected one argument"),
    ("server --log-level verbose", USAGE, "argument --log-level: invalid choice 'verbose'"),
    ("launch --log-level warn", USAGE, "did you mean 'warning'?"),
    ("launch --clients-per-process 0", USAGE, "argument --clients-per-process: must be >= 1 or auto, got 0"),
    ("certs init --out {tmp}/pki --days 0", USAGE, "argument --days"),
    ("clients --ids client-4..client-2 --connect 127.0.0.1:1", USAGE, "--ids: range 'client-4..client-2' runs "
                                                                      "backwards"),
    ("health 127.0.0.1:1 --timeout 0", USAGE, "fedhop health: --timeout must be positive, got 0"),
    # reproductions
    ("reproduce", USAGE, "the following arguments are required: NAME"),
    ("reproduce nosuch", USAGE, "fedhop reproduce: argument NAME: unknown reproduction 'nosuch' (known: "
                                "focus-fig4, fedcluster-e1, fedchs-digits, fgdro-toy, all)"),
    ("reproduce focus-fig", USAGE, "did you mean 'focus-fig4'?"),
    ("reproduce fedchs-digit --quick", USAGE, "did you mean 'fedchs-digits'?"),
    # spec files and --set
    ("spec {tmp}/nope.toml", USAGE, "spec file not found: "),
    ("simulate {bad_toml}", USAGE, "not valid TOML"),
    ("spec --set rounds", USAGE, "expected KEY=VALUE"),
    ("spec --set rouds=5", USAGE, "unknown key 'rouds' in the spec; known: name, algorithm,"),
    ("spec --set rouds=5", USAGE, "did you mean 'rounds'?"),
    ("simulate --set topology.clientz=3", USAGE, "unknown key 'clientz' in topology; known: clients, edges"),
    ("simulate --set topology.clientz=3", USAGE, "did you mean 'clients'?"),
    ("launch --set algorithm.options.lrr=0.1", USAGE, "did you mean 'lr'?"),
    ("spec --set rounds=zero", USAGE, "rounds"),
    ("spec --set rounds.x=1", USAGE, "rounds is a value, not a table"),
    ("simulate --set algorithm.name=fedvag", USAGE, "unknown algorithm 'fedvag'"),
    ("simulate --set algorithm.name=fedvag", USAGE, "did you mean 'fedavg'?"),
    ("spec --set algorithm.name=scafold", USAGE, "did you mean 'scaffold'?"),
    ("spec --explain fedchss", USAGE, "did you mean 'fedchs'?"),
    ("spec --set data.dataset=mnst", USAGE, "unknown dataset 'mnst'"),
    ("spec --set data.dataset=mnst", USAGE, "did you mean 'mnist'?"),
    ("spec --set model.name=lenett", USAGE, "did you mean 'lenet'?"),
    ("simulate {typo}", USAGE, "roundz: Extra inputs are not permitted (did you mean 'rounds'?)"),
    ("spec {typo}", USAGE, "topology.clientz: Extra inputs are not permitted (did you mean 'clients'?)"),
    ("launch {typo}", USAGE, "lrr: Extra inputs are not permitted (did you mean 'lr'?)"),
    # run folders and resuming
    ("simulate --out {full} --set rounds=1", USAGE, "--force"),
    ("launch --resume {tmp}/nope", USAGE, "cannot resume"),
    ("launch --resume {empty} --set rounds=3", USAGE, "--resume continues a run with its own spec; give no spec "
                                                      "file or --set"),
]


def _argv(line: str, tmp: Path) -> list[str]:
    spec = tmp / "spec.toml"
    spec.write_text('name = "mine"\nrounds = 1\n[topology]\nclients = 2\nedges = 0\n')
    (tmp / "bad.toml").write_text("rounds = = 3\n")
    (tmp / "typo.toml").write_text('roundz = 5\n[topology]\nclientz = 3\n[algorithm.options]\nlrr = 0.1\n')
    (tmp / "full").mkdir(exist_ok=True)
    (tmp / "full" / "notes.txt").write_text("mine\n")
    (tmp / "empty").mkdir(exist_ok=True)
    names = {"tmp": tmp, "spec": spec, "bad_toml": tmp / "bad.toml", "typo": tmp / "typo.toml", "full": tmp / "full",
             "empty": tmp / "empty"}
    return [w.format(**names) for w in line.split()]


def run_main(argv: list[str]) -> int:
    """``fedhop ARGV`` in this process: its exit code, whether it returns it or the parser exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def test_the_table_holds_at_least_40_distinct_mistakes():
    assert len({line for line, _, _ in MISTAKES}) >= 40


@pytest.mark.parametrize(("line", "code", "needle"), MISTAKES, ids=[f"{i}:{m[0]}" for i, m in enumerate(MISTAKES)])
def test_a_mistake_ends_in_one_line_and_its_code(line, code, needle, tmp_path, capsys):
    threads = threading.active_count()
    rc = run_main(_argv(line, tmp_path))
    out, err = capsys.readouterr()
    assert rc == code, err
    assert "Traceback" not in err and out == "", (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fedhop"), err
    assert needle.format(tmp=tmp_path) in lines[0], err
    # (<=: a thread an earlier test started may end meanwhile; a mistake must not add one)
    assert threading.active_count() <= threads, "a mistake left a thread running"
    assert psutil.Process().children() == [], "a mistake left a process running"
    assert not (tmp_path / "full" / "results.json").exists()


def test_every_reproduction_name_is_one_fedhop_reproduce_registers():
    from fedhop.cli.reproduce import REPRODUCTIONS
    from fedhop.reproduce import load_all

    assert sorted(REPRODUCTIONS) == sorted(load_all())


@pytest.mark.parametrize(("name", "key"), [("rounds", "rounds"), ("round", "rounds"), ("clients", "topology.clients"),
                                           ("lr", "algorithm.options.lr"), ("algorithm", "algorithm.name"),
                                           ("topology", None), ("frobnicate", None)])
def test_an_option_that_is_a_spec_field_maps_to_its_key(name, key):
    from fedhop.cli.suggest import spec_key_for, spec_keys

    assert spec_key_for(name, spec_keys()) == key


def test_did_you_mean_only_for_close_names():
    from fedhop.cli.suggest import did_you_mean

    assert did_you_mean("fedvag", ["fedavg", "fedchs"]) == "; did you mean 'fedavg'?"
    assert did_you_mean("zzz", ["fedavg", "fedchs"]) == ""


def test_a_closed_stdout_ends_quietly_with_141(capsys, monkeypatch):
    """The in-process half of `fedhop algorithms | head -1` (the real pipe: tests/integration): a BrokenPipeError
    on stdout ends the command with BROKEN_PIPE and nothing on stderr."""

    class Closed:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Closed())
    assert main(["algorithms"]) == ExitCode.BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_that_is_not_stdout_stays_a_bug(monkeypatch):
    """A BrokenPipeError from a socket is no closed pipe of the user's: it keeps its traceback."""
    def body(a):
        raise BrokenPipeError(32, "Broken pipe")

    import fedhop.cli.spec as spec_cli

    monkeypatch.setattr(spec_cli, "cmd_algorithms", body)
    with pytest.raises(BrokenPipeError):
        main(["algorithms"])


def test_log_level_is_on_every_command_wherever_it_is_put():
    from fedhop.cli.app import build_parser
    from fedhop.cli.errors import _parsers

    top = build_parser()
    parsers = _parsers(top)
    assert len([p for p in parsers if p.prog.count(" ") == 1]) >= 19  # every command, and their subcommands
    for p in parsers:
        assert "--log-level" in p._option_string_actions, p.prog
    for argv, level in [(["spec"], None), (["--log-level", "debug", "spec"], "debug"),
                        (["spec", "--log-level", "ERROR"], "error"),
                        (["certs", "--log-level", "info", "init", "--out", "x"], "info"),
                        (["--log-level", "debug", "certs", "init", "--out", "x"], "debug"),
                        (["certs", "init", "--out", "x", "--log-level", "warning"], "warning")]:
        assert build_parser().parse_args(argv).log_level == level, argv


def test_human_bytes_are_decimal():
    from fedhop.cli.console import human_bytes

    assert [human_bytes(n) for n in (0, 999, 1000, 923_520, 9_240_000, 12_345_678_901)] == \
        ["0 B", "999 B", "1.00 kB", "924 kB", "9.24 MB", "12.3 GB"]


def test_class_table_sums_both_directions_per_class():
    from fedhop.cli.console import class_table

    links = [{"src": "ps", "dst": "edge-0", "messages": 2, "payload_bytes": 1000, "message_bytes": 1100},
             {"src": "edge-0", "dst": "ps", "messages": 2, "payload_bytes": 1000, "message_bytes": 1100},
             {"src": "edge-0", "dst": "client-0", "messages": 4, "payload_bytes": 2_000_000,
              "message_bytes": 2_000_400},
             {"src": "edge-0", "dst": "edge-1", "messages": 1, "payload_bytes": 500, "message_bytes": 600}]
    rows = [line.split() for line in class_table(links).splitlines()]
    assert rows[0] == ["link", "class", "messages", "payload", "message"]
    assert rows[1:] == [["client<->edge", "4", "2.00", "MB", "2.00", "MB"],
                        ["edge<->edge", "1", "500", "B", "600", "B"],
                        ["edge<->PS", "4", "2.00", "kB", "2.20", "kB"],
                        ["all", "9", "2.00", "MB", "2.00", "MB"]]
    flat = class_table([{"src": "client-0", "dst": "ps", "messages": 1, "payload_bytes": 10, "message_bytes": 12,
                         "wire_bytes": 80}])
    assert [line.split()[0] for line in flat.splitlines()] == ["link", "client<->PS", "all"]
    assert flat.splitlines()[0].split()[-1] == "wire" and flat.splitlines()[1].split()[-2:] == ["80", "B"]


def test_the_bar_shows_the_runs_clock(capsys):
    """The bar's elapsed time is the run's (rounds.csv's elapsed_s, the summary's training time), not the time
    since the bar was made (which counts loading data and building the model)."""
    from fedhop.cli.console import Progress

    bar = Progress(rounds=3, label="simulate fedavg")
    bar.bar.start_t -= 100.0  # the bar was made long before round 1 (start-up)
    bar.on_round({"round": 2, "elapsed_s": 4.25})
    assert bar.bar._time() - bar.bar.start_t == pytest.approx(4.25, abs=0.5)
    bar.close()
    assert "2/3 [00:04<" in capsys.readouterr().err.replace("\r", "\n").splitlines()[-1]


def test_log_level_sets_the_level_and_keeps_a_roles_format():
    import logging

    from fedhop.cli.console import log_to_stderr, set_log_level

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        set_log_level("error")
        assert root.level == logging.ERROR
        log_to_stderr("error", fmt="%(levelname)s [%(client)s] %(message)s")  # `fedhop clients`: its own format
        assert root.level == logging.ERROR and root.handlers[0].formatter._fmt.startswith("%(levelname)s [")
        log_to_stderr("debug")
        assert root.level == logging.DEBUG
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[1]:
            root.addHandler(h)
        root.setLevel(saved[0])
