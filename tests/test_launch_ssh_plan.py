"""``bpslaunch --hosts`` without ssh: parsing, planning, bad input, and the remote runner
(``python -m byteps.launch.ssh_remote``) run locally through the same stdin protocol. The runs against
real sshd daemons are in ``tests/test_launch_ssh.py`` (engines session)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from byteps.launch import cli
from byteps.launch.common import ChildSpec, LaunchError
from byteps.launch.contract import JobIdentity
from byteps.launch.ssh import (
    DEFAULT_PORT_RANGE,
    HostSlots,
    SshOptions,
    build_ssh_plan,
    forwarded_env,
    parse_hostfile_text,
    parse_hosts,
    parse_server_hosts,
    request_line,
    ssh_argv,
)
from byteps.launch.supervise import run_job

PY = sys.executable
RUNNER = [PY, "-m", "byteps.launch.ssh_remote"]


def requests(specs):
    return [json.loads(s.stdin) for s in specs]


def test_parse_hosts():
    assert parse_hosts("h1:2,h2:2") == [HostSlots("h1", 2), HostSlots("h2", 2)]
    assert parse_hosts(" a , b.example.com:3 ") == [HostSlots("a", 1),
                                                   HostSlots("b.example.com", 3)]
    hs = parse_hosts("alice@10.0.0.5:4")
    assert hs == [HostSlots("alice@10.0.0.5", 4)] and hs[0].address == "10.0.0.5"
    assert parse_server_hosts("s1, s2") == ["s1", "s2"]


@pytest.mark.parametrize("text, word", [
    ("", "empty entry"), ("h1,,h2", "empty entry"), ("h1:0", "slots must be"),
    ("h1:x", "slots must be"), ("h1:", "slots must be"), ("fe80::1:2", "IPv6"),
    ("-oProxyCommand=x", "not a host name"), ("a b", "not a host name"),
])
def test_parse_hosts_errors(text, word):
    with pytest.raises(LaunchError, match=word):
        parse_hosts(text)


def test_parse_hostfile():
    text = "# cluster\n\nnode1 slots=4   # first\nnode2\tslots=4\nbob@node3:4\n  node4 slots=2\n"
    assert parse_hostfile_text(text) == [HostSlots("node1", 4), HostSlots("node2", 4),
                                         HostSlots("bob@node3", 4), HostSlots("node4", 2)]
    assert parse_hostfile_text("solo") == [HostSlots("solo", 1)]


@pytest.mark.parametrize("text, word", [
    ("a slots=2\nb max_slots=4\n", "line 2: unknown field 'max_slots=4'"),
    ("a slots=0\n", "line 1: slots must be"), ("a slots\n", "unknown field"),
    ("a:2 slots=2\n", "not both"), ("# nothing\n\n", "lists no hosts"),
    ("a;b slots=1\n", "not a host name"), ("a:1\nb:0\n", "hostfile line 2: slots must be"),
    ("fe80::1:2\n", "IPv6"),
])
def test_parse_hostfile_errors(text, word):
    with pytest.raises(LaunchError, match=word):
        parse_hostfile_text(text)


def test_forwarded_env():
    env = {"PATH": "/p", "PYTHONPATH": "/x", "LD_LIBRARY_PATH": "/l", "OMP_NUM_THREADS": "2",
           "HOME": "/home/me", "USER": "me", "PWD": "/w", "SSH_AUTH_SOCK": "/s",
           "SSH_CONNECTION": "c", "XDG_RUNTIME_DIR": "/r", "BASH_FUNC_f%%": "() { :; }",
           "DISPLAY": ":0", "DMLC_ROLE": "worker", "BYTEPS_SECRET": "old", "BYTEPS_LOG_LEVEL": "3"}
    assert forwarded_env(env) == {"PATH": "/p", "PYTHONPATH": "/x", "LD_LIBRARY_PATH": "/l",
                                  "OMP_NUM_THREADS": "2", "BYTEPS_LOG_LEVEL": "3"}


def test_ssh_argv_is_fixed_and_quoted():
    opts = SshOptions(port=2222, identity="/k/id", config="/c/cfg", python="/opt/py 3/python",
                      pythonpath="/a b:/c")
    argv = ssh_argv("alice@h1", opts)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "-T" in argv
    i = argv.index("--")
    assert argv[i - 6:i] == ["-F", "/c/cfg", "-p", "2222", "-i", "/k/id"]
    assert argv[i + 1:] == ["alice@h1", "env 'PYTHONPATH=/a b:/c' '/opt/py 3/python' "
                                        "-m byteps.launch.ssh_remote"]
    plain = ssh_argv("h1", SshOptions(python="/usr/bin/python3"))
    assert plain[-2:] == ["h1", "/usr/bin/python3 -m byteps.launch.ssh_remote"]
    assert "-p" not in plain and "-i" not in plain and "-F" not in plain


def test_plan_placement_environment_and_secrecy():
    ident = JobIdentity("job123", "s" * 64)
    base = {"PATH": "/p", "HOME": "/home/me", "FOO": "1", "SSH_AUTH_SOCK": "/agent"}
    specs = build_ssh_plan(
        parse_hosts("h1:2,h2:2"), ["python", "train.py", "--x"], server_hosts=["s1"],
        port=9000, interface="eth1", extra_env={"BAR": "2"}, base_env=base, cwd="/work",
        options=SshOptions(python="/py"), identity=ident)
    assert [s.label for s in specs] == [
        "h1 scheduler", "h1 server 0", "h2 server 1", "s1 server 2",
        "h1 worker 0", "h1 worker 1", "h2 worker 2", "h2 worker 3"]
    reqs = requests(specs)
    for spec, req in zip(specs, reqs):
        assert spec.argv == ssh_argv(spec.host, SshOptions(python="/py"))
        assert spec.env == base  # the ssh client gets the launcher's environment, no secret
        assert "s" * 64 not in " ".join(spec.argv)
        env = req["env"]
        assert req["protocol"] == 1 and req["cwd"] == "/work" and req["label"] == spec.label
        assert env["DMLC_ROLE"] == spec.role
        assert (env["DMLC_NUM_WORKER"], env["DMLC_NUM_SERVER"]) == ("2", "3")
        assert (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"]) == ("h1", "9000")
        assert (env["BYTEPS_JOB_ID"], env["BYTEPS_SECRET"]) == ("job123", "s" * 64)
        assert env["DMLC_INTERFACE"] == "eth1" and "DMLC_NODE_HOST" not in env
        assert (env["PATH"], env["FOO"], env["BAR"]) == ("/p", "1", "2")
        assert "HOME" not in env and "SSH_AUTH_SOCK" not in env
        assert "DMLC_NODE_HOST" in req["unset"] and "DMLC_ROLE" not in req["unset"]
    assert [r["argv"] for r in reqs[:4]] == [["/py", "-m", "byteps.server"]] * 4
    workers = reqs[4:]
    assert [r["argv"] for r in workers] == [["python", "train.py", "--x"]] * 4
    assert [(r["env"]["DMLC_WORKER_ID"], r["env"]["BYTEPS_LOCAL_RANK"]) for r in workers] == \
        [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {r["env"]["BYTEPS_LOCAL_SIZE"] for r in workers} == {"2"}


def test_plan_defaults():
    specs = build_ssh_plan([HostSlots("root@h1", 1)], ["cmd"], base_env={})
    req = requests(specs)
    port = int(req[0]["env"]["DMLC_PS_ROOT_PORT"])
    assert DEFAULT_PORT_RANGE[0] <= port < DEFAULT_PORT_RANGE[1]
    assert req[0]["env"]["DMLC_PS_ROOT_URI"] == "h1"  # the address, without user@
    assert [s.label for s in specs] == ["root@h1 scheduler", "root@h1 server 0",
                                        "root@h1 worker 0"]
    assert req[0]["cwd"] == os.getcwd() and req[0]["argv"][0] == sys.executable
    assert "DMLC_INTERFACE" not in req[0]["env"]
    assert len({r["env"]["BYTEPS_SECRET"] for r in req}) == 1
    assert requests(build_ssh_plan([HostSlots("h1", 1)], ["cmd"], base_env={}))[0]["env"][
        "BYTEPS_SECRET"] != req[0]["env"]["BYTEPS_SECRET"]  # fresh per job


@pytest.mark.parametrize("hosts, servers, kw, word", [
    ("h1:2,h2:1", [], {}, r"same number of workers .* got h1:2, h2:1"),
    ("h1,h2,h1", [], {}, "host h1 is listed twice, as worker host and worker host"),
    ("h1,u@h2", ["h2"], {}, "host h2 is listed twice, as worker host and server host"),
    ("h1", ["s", "s"], {}, "listed twice, as server host and server host"),
    ("h1", [], {"port": 0}, "--port must be"),
    ("h1", [], {"options": SshOptions(port=70000)}, "--ssh-port must be"),
    ("h1", [], {"interface": "eth0; rm"}, "not an interface name"),
])
def test_plan_errors(hosts, servers, kw, word):
    with pytest.raises(LaunchError, match=word):
        build_ssh_plan(parse_hosts(hosts), ["cmd"], server_hosts=servers, base_env={}, **kw)
    with pytest.raises(LaunchError, match="no COMMAND"):
        build_ssh_plan(parse_hosts("h1"), [], base_env={})


@pytest.mark.parametrize("args, word", [
    (["--hosts", "a,b", "--workers", "2", "cmd"], "--workers belong to local mode"),
    (["--hosts", "a", "--local-size", "2", "cmd"], "--local-size belong to local mode"),
    (["--hosts", "a", "--hostfile", "f", "cmd"], "exactly one of --hosts and --hostfile"),
    (["--ssh-port", "22", "--workers", "1", "cmd"], "--ssh-port: only with --hosts"),
    (["--server-hosts", "s", "cmd"], "--server-hosts: only with --hosts"),
    (["--hostfile", "/nonexistent/hosts", "cmd"], "--hostfile /nonexistent/hosts"),
    (["--hosts", "a", "--ssh-identity", "/nonexistent/key", "cmd"], "no such file"),
    (["--hosts", "a", "--ssh-config", "/nonexistent/cfg", "cmd"], "no such file"),
    (["--hosts", "a:2,b:1", "cmd"], "same number of workers"),
    (["--hosts", "a", "--env", "DMLC_INTERFACE=x", "cmd"], "set by bpslaunch itself"),
    (["--hosts", "a"], "no COMMAND"),
])
def test_usage_errors_exit_2(args, word, capsys):
    assert cli.main(args, env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith("bpslaunch: ") and word in err, err
    assert "Traceback" not in err


def test_hostfile_through_main(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=3\n")
    assert cli.main(["--hostfile", str(hostfile), "cmd"], env={}) == 2
    assert "got a:2, b:3" in capsys.readouterr().err


# ------------------------------------------------------------------- the remote runner, locally


def run_runner(req: bytes, close: bool = True, timeout: float = 30):
    """``close``: send ``req`` and end the input, return (code, stdout, stderr); otherwise
    return the running process with its input still open."""
    proc = subprocess.Popen(RUNNER, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    if close:
        out, err = proc.communicate(req, timeout=timeout)
        return proc.returncode, out.decode(), err.decode()
    proc.stdin.write(req)
    proc.stdin.flush()
    return proc


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_runner_runs_child_with_env_cwd_and_code(tmp_path):
    code = ("import os, sys; print(os.environ['X'], os.environ.get('DMLC_NODE_HOST'), "
            "os.getcwd()); sys.stdout.flush(); sys.exit(3)")
    req = request_line([PY, "-c", code], {"X": "42"}, str(tmp_path), "h worker 0")
    os.environ["DMLC_NODE_HOST"] = "stale"  # the remote login's value is unset by the request
    try:
        proc = subprocess.Popen(RUNNER, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    finally:
        del os.environ["DMLC_NODE_HOST"]
    proc.stdin.write(req)
    proc.stdin.flush()  # the lifeline stays open: the child's own exit ends the runner
    out = proc.stdout.read().decode()
    assert proc.wait(10) == 3
    assert out.split() == ["42", "None", str(tmp_path)]


def test_runner_reports_signal_death_as_128_plus_n():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = run_runner(request_line([PY, "-c", code], {}, None, "h worker 1"), close=False)
    assert proc.wait(10) == 137
    err = proc.stderr.read().decode()
    assert "byteps.launch.ssh_remote (h worker 1): pid " in err and "killed by SIGKILL" in err, err


def test_runner_stops_child_when_lifeline_ends():
    code = ("import os, subprocess, sys, time; g = subprocess.Popen(['sleep', '60']); "
            "print(os.getpid(), g.pid, flush=True); time.sleep(60)")
    proc = run_runner(request_line([PY, "-c", code], {}, None, "h server 0"), close=False)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert all(alive(p) for p in pids)
    t0 = time.monotonic()
    proc.stdin.close()  # what bpslaunch does to stop it, and what a lost connection does
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 3
    assert not any(alive(p) for p in pids)  # the child and its group (the sleep)


def test_runner_kills_what_an_exited_child_left_in_its_group():
    code = ("import subprocess; g = subprocess.Popen(['sleep', '60']); print(g.pid, flush=True)")
    proc = run_runner(request_line([PY, "-c", code], {}, None, "h worker 0"), close=False)
    leftover = int(proc.stdout.readline())
    assert proc.wait(10) == 0
    deadline = time.monotonic() + 5
    while alive(leftover) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(leftover)


@pytest.mark.parametrize("req, code, word", [
    (b"", 2, "no request"), (b"{not json\n", 2, "not JSON"),
    (b'{"protocol": 9, "argv": ["x"]}\n', 2, "protocol-1"),
    (b'{"protocol": 1, "argv": []}\n', 2, "'argv'"),
    (request_line(["/nonexistent/cmd"], {}, None, "h worker 0"), 127, "cannot start"),
    (request_line(["true"], {}, "/nonexistent/dir", "h worker 0"), 127, "/nonexistent/dir"),
])
def test_runner_errors(req, code, word):
    rc, _, err = run_runner(req)
    assert rc == code and word in err, err


def test_run_job_stops_lifeline_children_and_names_remote_signal_death():
    """run_job with two runner specs (as over ssh, without ssh): one's child is SIGKILLed, so
    the job fails naming it 'killed by SIGKILL' (code 137 relayed); the other, a long
    sleeper, is stopped by closing its lifeline, and its remote child is gone."""
    sleeper = ("import os, time; print('PID', os.getpid(), flush=True); time.sleep(60)")
    victim = "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)"
    env = dict(os.environ)
    specs = [ChildSpec("server", 0, RUNNER, env, host="hostA",
                       stdin=request_line([PY, "-c", sleeper], {}, None, "hostA server 0")),
             ChildSpec("worker", 0, RUNNER, env, host="hostB",
                       stdin=request_line([PY, "-c", victim], {}, None, "hostB worker 0"))]
    out, err = io.StringIO(), io.StringIO()
    rc = run_job(specs, grace=0.2, stdout=out, stderr=err)
    assert rc == 137, err.getvalue()
    assert "bpslaunch: hostB worker 0 (ssh pid " in err.getvalue()
    assert "exited with code 137 (killed by SIGKILL); stopping the job" in err.getvalue()
    assert "[hostB worker 0] byteps.launch.ssh_remote (hostB worker 0): pid " in err.getvalue()
    pid = int(out.getvalue().split("PID ")[1].split()[0])
    assert out.getvalue().startswith("[hostA server 0] PID ")
    assert not alive(pid)
