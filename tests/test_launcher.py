"""Tests of ``bpslaunch`` (byteps.launch) with real child processes.

No byteps core is needed: single-machine jobs start no scheduler/server, and distributed jobs
replace ``python -m byteps.server`` by a stand-in through ``main(..., server_argv=...)``.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from byteps.launch import cli, upstream
from byteps.launch.common import LaunchError, cleanup_shm
from byteps.launch.local import build_local_plan
from byteps.launch.supervise import PrefixWriter, split_pieces
from byteps.launch.upstream import validate_upstream_env

PY = sys.executable

# Runs bpslaunch in a fresh interpreter: argv[1] is the JSON server_argv (or null).
_LAUNCH = (
    "import json, sys; from byteps.launch.cli import main; "
    "sys.exit(main(sys.argv[2:], server_argv=json.loads(sys.argv[1])))"
)

# A child that prints its environment as JSON (one line) and its pid.
_PRINT_ENV = (
    "import json, os; keys = {keys!r}; "
    "print(json.dumps(dict({{k: os.environ.get(k) for k in keys}}, pid=os.getpid())))"
)
_ENV_KEYS = [
    "DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_WORKER_ID", "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT", "DMLC_NODE_HOST", "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE",
    "BYTEPS_JOB_ID", "BYTEPS_SECRET", "PYTHONUNBUFFERED", "FOO", "BPSL_TEST_PARENT",
]


def _cmd(server_argv, args):
    return [PY, "-c", _LAUNCH, json.dumps(server_argv), *args]


def launch(args, server_argv=None, env=None, timeout=40):
    """Run bpslaunch to completion; returns (CompletedProcess, seconds)."""
    start = time.monotonic()
    proc = subprocess.run(_cmd(server_argv, args), capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    return proc, time.monotonic() - start


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def json_lines(text):
    """{label: parsed JSON} for lines ``[label] {...}``."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\[([a-z]+(?: \d+)?)\] (\{.*\})$", line)
        if m:
            out[m.group(1)] = json.loads(m.group(2))
    return out


def pids_in(text):
    return [int(p) for p in re.findall(r"pid=(\d+)", text)]


# ------------------------------------------------------------------------------------------
# Plans, parsing, validation (no processes)
# ------------------------------------------------------------------------------------------


def test_local_plan_distributed():
    specs = build_local_plan(2, 2, ["train"], local_size=2, server_argv=["srv"], port=1234,
                             base_env={"HOME": "/h", "DMLC_WORKER_ID": "9", "DMLC_ROLE": "x"},
                             extra_env={"FOO": "bar"})
    assert [s.label for s in specs] == ["scheduler", "server 0", "server 1",
                                        "worker 0", "worker 1", "worker 2", "worker 3"]
    job_ids = {s.env["BYTEPS_JOB_ID"] for s in specs}
    secrets_ = {s.env["BYTEPS_SECRET"] for s in specs}
    assert len(job_ids) == 1 and re.fullmatch(r"[0-9a-f]{12}", job_ids.pop())
    assert len(secrets_) == 1 and re.fullmatch(r"[0-9a-f]{64}", secrets_.pop())
    for s in specs:
        assert s.env["HOME"] == "/h" and s.env["FOO"] == "bar"
        assert s.env["DMLC_NUM_WORKER"] == "2" and s.env["DMLC_NUM_SERVER"] == "2"
        assert s.env["DMLC_PS_ROOT_PORT"] == "1234" and s.env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert s.env["DMLC_ROLE"] == s.role
        assert all(s.env["BYTEPS_SECRET"] not in a for a in s.argv)
    assert specs[0].argv == ["srv"] and "DMLC_WORKER_ID" not in specs[0].env
    w3 = specs[-1]
    assert (w3.argv, w3.env["DMLC_WORKER_ID"], w3.env["BYTEPS_LOCAL_RANK"],
            w3.env["BYTEPS_LOCAL_SIZE"]) == (["train"], "1", "1", "2")


def test_local_plan_single_machine_and_forced():
    specs = build_local_plan(1, 3, ["t"], local_size=2, base_env={})
    assert [s.label for s in specs] == ["worker 0", "worker 1"]
    assert specs[0].env["DMLC_NUM_SERVER"] == "0"
    assert 1 <= int(specs[0].env["DMLC_PS_ROOT_PORT"]) <= 65535
    forced = build_local_plan(1, 1, ["t"], base_env={}, server_argv=["s"],
                              extra_env={"BYTEPS_FORCE_DISTRIBUTED": "1"})
    assert [s.label for s in forced] == ["scheduler", "server 0", "worker 0"]


@pytest.mark.parametrize("kwargs, word", [
    ({"workers": 2, "servers": 0}, "--servers 0"),
    ({"workers": 0, "servers": 1}, "--workers"),
    ({"workers": 1, "servers": 1, "local_size": 0}, "--local-size"),
    ({"workers": 1, "servers": 1, "port": 70000}, "--port"),
])
def test_local_plan_errors(kwargs, word):
    with pytest.raises(LaunchError, match=word):
        build_local_plan(command=["t"], base_env={}, **kwargs)


def test_usage_errors_exit_2(capsys):
    assert cli.main(["--workers", "2", "--servers", "0", "true"], env={}) == 2
    assert cli.main(["--workers", "1", "--env", "DMLC_ROLE=x", "true"], env={}) == 2
    assert cli.main(["--workers", "1", "--env", "NOEQUALS", "true"], env={}) == 2
    assert cli.main(["--workers", "1"], env={}) == 2
    assert cli.main(["--workers", "1", "--grace", "-1", "true"], env={}) == 2
    assert cli.main(["--workers", "1", "--grace", "nan", "true"], env={}) == 2
    assert cli.main(["--bogus"], env={}) == 2
    assert cli.main(["--local-size", "2", "true"], env={}) == 2  # upstream mode
    err = capsys.readouterr().err
    for word in ("--servers 0", "DMLC_ROLE is set by bpslaunch", "NOEQUALS", "no COMMAND",
                 "--grace", "--local-size need --workers"):
        assert word in err
    assert cli.main(["--help"]) == 0


@pytest.mark.parametrize("env, word", [
    ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
      "DMLC_PS_ROOT_PORT": "9000", "DMLC_WORKER_ID": "0"}, "DMLC_PS_ROOT_URI is not set"),
    ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "abc", "DMLC_WORKER_ID": "0"},
     "DMLC_NUM_WORKER='abc' is not an integer"),
    ({"DMLC_NUM_WORKER": "1"}, "DMLC_ROLE is not set"),
    ({"DMLC_ROLE": "chief", "DMLC_NUM_WORKER": "1"}, "DMLC_ROLE='chief'"),
    ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "1"}, "DMLC_WORKER_ID is not set"),
    ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "1", "DMLC_WORKER_ID": "1"},
     "DMLC_WORKER_ID='1' is out of range"),
    ({"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
      "DMLC_PS_ROOT_URI": "h", "DMLC_PS_ROOT_PORT": "0"}, "DMLC_PS_ROOT_PORT='0'"),
    ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "1", "DMLC_WORKER_ID": "0",
      "BYTEPS_LOCAL_SIZE": "0"}, "BYTEPS_LOCAL_SIZE='0'"),
    ({"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "1", "BYTEPS_FORCE_DISTRIBUTED": "1"},
     "DMLC_NUM_SERVER is not set"),
    ({"DMLC_ROLE": "scheduler", "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
      "DMLC_PS_ROOT_PORT": "9000"}, "DMLC_PS_ROOT_URI is not set (required for a scheduler"),
    ({"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "0",
      "DMLC_PS_ROOT_URI": "h", "DMLC_PS_ROOT_PORT": "9000"}, "DMLC_NUM_SERVER='0'"),
])
def test_upstream_validation(env, word, capsys):
    assert any(word in e for e in validate_upstream_env(env))
    assert cli.main(["true"], env=env) == 2
    err = capsys.readouterr().err
    assert err.startswith("bpslaunch: ") and word in err


def test_upstream_validation_ok():
    assert validate_upstream_env({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "1",
                                  "DMLC_WORKER_ID": "0"}) == []
    assert validate_upstream_env({"DMLC_ROLE": "scheduler", "DMLC_NUM_WORKER": "2",
                                  "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "10.0.0.1",
                                  "DMLC_PS_ROOT_PORT": "9000"}) == []


def test_split_pieces_and_prefix_writer():
    assert split_pieces(b"a\nb\r\nc\rd") == ([b"a\n", b"b\r\n", b"c\r"], b"d")
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    w = PrefixWriter("[w 1] ", out, threading.Lock())
    for piece in (b"\r", b"10%\r", b"20%\r", b"\n", b"done \xff\n"):  # \r\n split across reads
        w.write_piece(piece)
    out.flush()
    assert out.buffer.getvalue().decode() == "\r[w 1] 10%\r[w 1] 20%\r\n[w 1] done \ufffd\n"


def test_cleanup_shm(tmp_path):
    for name in ("byteps_abc123_x", "byteps_abc123_y", "byteps_other_x"):
        (tmp_path / name).write_bytes(b"")
    removed = cleanup_shm("abc123", str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == ["byteps_abc123_x", "byteps_abc123_y"]
    assert os.listdir(tmp_path) == ["byteps_other_x"]
    assert cleanup_shm(None, str(tmp_path)) == [] and cleanup_shm("*", str(tmp_path)) == []


# ------------------------------------------------------------------------------------------
# Real processes
# ------------------------------------------------------------------------------------------


def test_distributed_environment_and_lingering_servers_stopped():
    """Every child's environment; servers that never exit are stopped after grace; exit 0."""
    printer = _PRINT_ENV.format(keys=_ENV_KEYS)
    server = [PY, "-c", printer + "; import time; time.sleep(60)"]
    env = dict(os.environ, BPSL_TEST_PARENT="yes", DMLC_WORKER_ID="7")
    proc, took = launch(["--workers", "2", "--servers", "2", "--local-size", "2", "--grace",
                         "0.5", "--env", "FOO=bar=baz", PY, "-c", printer], server, env=env)
    assert proc.returncode == 0, proc.stderr
    assert took < 10
    got = json_lines(proc.stdout)
    assert sorted(got) == ["scheduler", "server 0", "server 1",
                           "worker 0", "worker 1", "worker 2", "worker 3"]
    assert len({g["BYTEPS_JOB_ID"] for g in got.values()}) == 1
    assert len({g["BYTEPS_SECRET"] for g in got.values()}) == 1
    assert len({g["DMLC_PS_ROOT_PORT"] for g in got.values()}) == 1
    for label, g in got.items():
        role = label.split()[0]
        assert g["DMLC_ROLE"] == role and g["FOO"] == "bar=baz" and g["BPSL_TEST_PARENT"] == "yes"
        assert (g["DMLC_NUM_WORKER"], g["DMLC_NUM_SERVER"]) == ("2", "2")
        assert g["DMLC_PS_ROOT_URI"] == g["DMLC_NODE_HOST"] == "127.0.0.1"
        assert g["PYTHONUNBUFFERED"] == "1" and len(g["BYTEPS_SECRET"]) == 64
        if role == "worker":
            rank = int(label.split()[1])
            assert (g["DMLC_WORKER_ID"], g["BYTEPS_LOCAL_RANK"], g["BYTEPS_LOCAL_SIZE"]) == (
                str(rank // 2), str(rank % 2), "2")
        else:
            assert g["DMLC_WORKER_ID"] is None and g["BYTEPS_LOCAL_RANK"] is None
    assert wait_gone([g["pid"] for g in got.values()]) == []


def test_prefixing_stdout_stderr_and_cr():
    code = ("import sys; sys.stdout.write('out1\\nout2'); sys.stdout.flush(); "
            "sys.stderr.buffer.write(b'\\r10%\\r20%\\rdone\\r\\nbad \\xff\\n')")
    proc = subprocess.run(_cmd(None, ["--workers", "1", "--", PY, "-c", code]),
                          capture_output=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"[worker 0] out1\n[worker 0] out2\n"
    assert proc.stderr == (b"\r[worker 0] 10%\r[worker 0] 20%\r[worker 0] done\r\n"
                           b"[worker 0] bad \xef\xbf\xbd\n")
    # options after COMMAND belong to COMMAND
    proc, _ = launch(["--workers", "1", PY, "-c", "import sys; print(sys.argv[1:])",
                      "--workers", "5"])
    assert proc.stdout == "[worker 0] ['--workers', '5']\n"


def test_long_line_passes_through_at_once():
    """A child printing one 4 MiB line (a dumped list, say) is copied in well under a second of
    the launcher's time; cutting pieces with a regular expression took minutes, and the child,
    blocked writing to its full pipe, stalled with it."""
    code = "import sys; sys.stdout.write('x' * (4 << 20) + '\\n' + 'y' * 70000); sys.stdout.flush()"
    t0 = time.monotonic()
    proc = subprocess.run(_cmd(None, ["--workers", "1", "--", PY, "-c", code]),
                          capture_output=True, timeout=60, check=False)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"[worker 0] " + b"x" * (4 << 20) + b"\n[worker 0] " + b"y" * 70000 + b"\n"
    assert took < 15, took


def test_unterminated_long_line_is_written_in_bounded_parts():
    """A 3 MiB line of two-byte UTF-8 characters at odd offsets (so any cut at a pipe-read
    boundary splits a character), written without a terminator for a while, comes out as one
    prefixed line with no character mangled: the launcher holds at most about 1 MiB of it."""
    code = ("import sys, time; w = sys.stdout.buffer; "
            "w.write(b'a' + ('\\u00e9' * (3 << 19)).encode()); w.flush(); "
            "time.sleep(0.5); w.write(b'end\\nnext\\n'); w.flush()")
    proc = subprocess.run(_cmd(None, ["--workers", "1", "--", PY, "-c", code]),
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    want = ("[worker 0] a" + "\u00e9" * (3 << 19) + "end\n[worker 0] next\n").encode()
    assert proc.stdout == want


def test_failure_exit_code_and_peers_terminated():
    code = ("import os, sys, time; r = int(os.environ['BYTEPS_LOCAL_RANK']); "
            "print(f'pid={os.getpid()}', flush=True); time.sleep(0.3)\n"
            "if r == 0: sys.exit(3)\n"
            "time.sleep(60)")
    proc, took = launch(["--workers", "1", "--local-size", "3", "--grace", "1", PY, "-c", code])
    assert proc.returncode == 3
    assert re.search(r"^bpslaunch: worker 0 \(pid \d+\) exited with code 3; stopping the job$",
                     proc.stderr, re.MULTILINE), proc.stderr
    assert took < 1 + 3 + 3
    pids = pids_in(proc.stdout)
    assert len(pids) == 3 and wait_gone(pids, 1.0) == []


def test_signal_death_and_sigkill_escalation():
    """A worker killed by SIGUSR1 -> 138; a peer ignoring SIGTERM is SIGKILLed 3 s later."""
    code = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(f'pid={os.getpid()}', flush=True); time.sleep(0.3)\n"
            "if os.environ['BYTEPS_LOCAL_RANK'] == '0': os.kill(os.getpid(), signal.SIGUSR1)\n"
            "time.sleep(60)")
    proc, took = launch(["--workers", "1", "--local-size", "2", "--grace", "0.2", PY, "-c", code])
    assert proc.returncode == 128 + signal.SIGUSR1
    assert "worker 0 (pid" in proc.stderr and "SIGUSR1" in proc.stderr
    assert 3.0 <= took < 9
    assert wait_gone(pids_in(proc.stdout), 1.0) == []


def test_server_failure_stops_job():
    server = [PY, "-c", ("import os, sys, time; print(f'pid={os.getpid()}', flush=True); "
                         "time.sleep(0.5); sys.exit(4 if os.environ['DMLC_ROLE'] == 'server' "
                         "else 0)")]
    worker = "import os, time; print(f'pid={os.getpid()}', flush=True); time.sleep(60)"
    proc, took = launch(["--workers", "2", "--servers", "1", "--grace", "0.5", PY, "-c", worker],
                        server)
    assert proc.returncode == 4, proc.stderr
    assert re.search(r"bpslaunch: server 0 \(pid \d+\) exited with code 4", proc.stderr)
    assert took < 8
    pids = pids_in(proc.stdout)
    assert len(pids) == 4 and wait_gone(pids, 1.0) == []


def _start_and_read(args, want_pids, want_texts=()):
    """Start bpslaunch, read stdout until ``want_pids`` pids and ``want_texts`` were seen."""
    proc = subprocess.Popen(_cmd(None, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    buf = b""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = buf.decode()
        if len(pids_in(text)) >= want_pids and all(t in text for t in want_texts):
            return proc, text
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
    proc.kill()
    raise AssertionError(f"launcher output incomplete: {buf!r}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_children_and_cr_is_live(sig):
    code = ("import os, sys, time; print(f'pid={os.getpid()}', flush=True); "
            "sys.stdout.write('tick\\r'); sys.stdout.flush(); time.sleep(60)")
    proc, text = _start_and_read(["--workers", "1", "--local-size", "2", PY, "-c", code], 2,
                                 ["[worker 0] tick\r", "[worker 1] tick\r"])
    proc.send_signal(sig)
    assert proc.wait(timeout=10) == 128 + sig
    proc.stdout.close()
    proc.stderr.close()
    assert wait_gone(pids_in(text), 1.0) == []


def test_sigkill_to_launcher_kills_children():
    code = "import os, time; print(f'pid={os.getpid()}', flush=True); time.sleep(60)"
    proc, text = _start_and_read(["--workers", "1", "--local-size", "2", PY, "-c", code], 2)
    proc.kill()
    proc.wait(timeout=5)
    proc.stdout.close()
    proc.stderr.close()
    assert wait_gone(pids_in(text), 5.0) == []


def test_command_not_found():
    proc, _ = launch(["--workers", "1", "/nonexistent/bpsl-command"])
    assert proc.returncode == 127
    assert "cannot start worker 0" in proc.stderr


def test_shm_cleanup_local_mode():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    other = "/dev/shm/byteps_bpsltestother_keep"
    open(other, "w").close()
    try:
        code = ("import os; p = '/dev/shm/byteps_' + os.environ['BYTEPS_JOB_ID'] + '_seg'; "
                "open(p, 'w').close(); print(p)")
        proc, _ = launch(["--workers", "1", PY, "-c", code])
        assert proc.returncode == 0, proc.stderr
        seg = proc.stdout.split("] ", 1)[1].strip()
        assert seg.startswith("/dev/shm/byteps_") and not os.path.exists(seg)
        assert "removed 1 leftover shared-memory segment" in proc.stderr
        assert os.path.exists(other)
    finally:
        os.unlink(other)


def test_upstream_worker_and_server_roles():
    printer = _PRINT_ENV.format(keys=_ENV_KEYS)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("DMLC_", "BYTEPS_"))}
    env = dict(base, DMLC_ROLE="worker", DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1",
               DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT="9999", DMLC_WORKER_ID="1",
               BYTEPS_LOCAL_SIZE="2")
    proc, _ = launch([PY, "-c", printer], env=env)
    assert proc.returncode == 0, proc.stderr
    got = json_lines(proc.stdout)
    assert sorted(got) == ["worker 2", "worker 3"]
    assert got["worker 3"]["BYTEPS_LOCAL_RANK"] == "1" and got["worker 3"]["DMLC_WORKER_ID"] == "1"
    assert got["worker 2"]["BYTEPS_JOB_ID"] is None and got["worker 2"]["BYTEPS_SECRET"] is None
    # a server ignores COMMAND and runs the server command; its failure is the exit code
    server = [PY, "-c", "import os, sys; print(os.environ['DMLC_ROLE']); sys.exit(5)"]
    proc, _ = launch(["ignored-command"], server, env=dict(env, DMLC_ROLE="server"))
    assert proc.returncode == 5 and proc.stdout == "[server] server\n"
    # an explicitly asked-for scheduler or server runs even when its own environment describes
    # a single-machine job (upstream's harness sets BYTEPS_FORCE_DISTRIBUTED in the worker only)
    single = dict(base, DMLC_NUM_WORKER="1", DMLC_NUM_SERVER="1", DMLC_PS_ROOT_URI="127.0.0.1",
                  DMLC_PS_ROOT_PORT="9999")
    for role in ("scheduler", "server"):
        proc, _ = launch([], server, env=dict(single, DMLC_ROLE=role))
        assert proc.returncode == 5 and proc.stdout == f"[{role}] {role}\n", proc.stderr
        assert "BYTEPS_FORCE_DISTRIBUTED=1" in proc.stderr
    # ... and then needs the cluster description like any server or scheduler
    assert cli.main([], env=dict(base, DMLC_ROLE="scheduler", DMLC_NUM_WORKER="1")) == 2


def test_upstream_single_machine_worker_needs_no_cluster():
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "1", "DMLC_WORKER_ID": "0"}
    assert validate_upstream_env(env) == []
    specs = upstream.build_upstream_plan(env, ["train"])
    assert [s.label for s in specs] == ["worker 0"]
