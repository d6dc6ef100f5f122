"""``bpslaunch --slurm`` without Slurm: parsing the allocation, the srun steps it plans, the
failure report, ``byteps.launch.slurm_task``'s mapping and the launcher's mode selection.

Slurm's client commands are replaced by a fake runner (the real ones are exercised by
tests/test_launch_slurm.py against a real cluster).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from byteps.launch import slurm as ls
from byteps.launch import slurm_task
from byteps.launch.cli import main
from byteps.launch.common import LaunchError
from byteps.launch.contract import JobIdentity

IDENTITY = JobIdentity("0123456789ab", "s3cr3t" * 10)


def fake_scontrol(nodes=("n0", "n1"), addrs=None):
    """A Runner answering ``scontrol show hostnames`` and ``scontrol -o show node``."""
    addrs = addrs or {}

    def run(argv):
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return "".join(f"{n}\n" for n in nodes)
        if argv[:4] == ["scontrol", "-o", "show", "node"]:
            node = argv[4]
            if node not in addrs:
                raise LaunchError(f"Node {node} not found")
            return f"NodeName={node} Arch=x86_64 NodeAddr={addrs[node]} NodeHostName={node}\n"
        raise AssertionError(f"unexpected command {argv}")

    return run


def alloc_env(**extra):
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[0-1]", **extra}


# ------------------------------------------------------------------------------- parsing --


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), (" 4(x2) , 3 ", [4, 4, 3]),
])
def test_parse_tasks_per_node(text, counts):
    assert ls.parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(x0)", "0", "2(3)", "2,,1", "-1"])
def test_parse_tasks_per_node_rejects(text):
    with pytest.raises(LaunchError, match="tasks per node"):
        ls.parse_tasks_per_node(text)


def test_read_allocation_from_tasks_per_node():
    alloc = ls.read_allocation(alloc_env(SLURM_TASKS_PER_NODE="2(x2)", SLURMD_NODENAME="n0"),
                               fake_scontrol())
    assert alloc == ls.SlurmAllocation("42", ("n0", "n1"), 2, "n0")


def test_read_allocation_prefers_ntasks_per_node():
    env = alloc_env(SLURM_NTASKS_PER_NODE="3", SLURM_TASKS_PER_NODE="1(x2)")
    assert ls.read_allocation(env, fake_scontrol()).local_size == 3


def test_unequal_tasks_per_node_is_an_error():
    with pytest.raises(LaunchError, match=r"unequal tasks per node .*n0: 2, n1: 1"):
        ls.read_allocation(alloc_env(SLURM_TASKS_PER_NODE="2,1"), fake_scontrol())


def test_tasks_per_node_must_match_the_node_count():
    with pytest.raises(LaunchError, match=r"describes 3 node\(s\) but the allocation has 2"):
        ls.read_allocation(alloc_env(SLURM_TASKS_PER_NODE="1(x3)"), fake_scontrol())


@pytest.mark.parametrize("env, message", [
    ({}, "SLURM_JOB_ID is not set"),
    ({"SLURM_JOB_ID": "7"}, "SLURM_JOB_NODELIST is not set"),
    (alloc_env(), "SLURM_TASKS_PER_NODE is set"),
    (alloc_env(SLURM_TASKS_PER_NODE="1(x2)", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1"),
     "runs once per job, but this is task 1 of a job step with 2 tasks"),
])
def test_read_allocation_errors(env, message):
    with pytest.raises(LaunchError, match=message):
        ls.read_allocation(env, fake_scontrol())


def test_node_list_with_a_duplicate_is_refused():
    with pytest.raises(LaunchError, match="names a node twice"):
        ls.read_allocation(alloc_env(SLURM_TASKS_PER_NODE="1(x2)"), fake_scontrol(("a", "a")))


def test_node_address_is_nodeaddr_or_the_name():
    run = fake_scontrol(addrs={"n0": "10.1.2.3"})
    assert ls.node_address("n0", run) == "10.1.2.3"
    assert ls.node_address("n1", run) == "n1"  # scontrol does not know it: its name


def test_port_free_on_the_scheduler_node_or_from_the_job_id():
    here = ls.SlurmAllocation("42", ("n0", "n1"), 1, "n0")
    assert 1024 <= ls.choose_port(here) <= 65535
    login = ls.SlurmAllocation("123456", ("n0", "n1"), 1, None)
    assert ls.choose_port(login) == ls.PORT_BASE + 123456 % ls.PORT_SPAN
    assert ls.choose_port(ls.SlurmAllocation("77_3", ("n0",), 1, "n5")) == ls.PORT_BASE + 773


# ------------------------------------------------------------------------------ the plan --


def _plan(**kw):
    alloc = ls.SlurmAllocation("42", ("n0", "n1", "n2"), 2, "n0")
    base = {"PATH": "/usr/bin", "DMLC_ROLE": "stale", "BYTEPS_SECRET": "stale", **kw.pop("base", {})}
    return ls.build_slurm_plan(alloc, ["python", "train.py", "--epochs", "3"],
                               scheduler_host="10.0.0.1", port=1234, base_env=base,
                               identity=IDENTITY, python="/venv/bin/python",
                               server_argv=["server-bin"], **kw)


def _opt(argv, name):
    return [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]


def test_plan_steps_and_environments():
    sched, server, worker = _plan(servers_per_node=2)
    assert [s.role for s in (sched, server, worker)] == ["scheduler", "server", "worker"]
    assert all(s.rank is None for s in (sched, server, worker))  # srun --label numbers tasks
    for spec, nodes, ntasks, per_node in ((sched, "n0", "1", "1"), (server, "n0,n1,n2", "6", "2"),
                                          (worker, "n0,n1,n2", "6", "2")):
        argv = spec.argv
        assert argv[0] == "srun" and "--overlap" in argv and "--label" in argv
        assert "--kill-on-bad-exit=1" in argv and "--quit-on-interrupt" in argv
        assert "--export=ALL" in argv and "--distribution=block" in argv
        assert _opt(argv, "--nodelist") == [nodes] and _opt(argv, "--ntasks") == [ntasks]
        assert _opt(argv, "--ntasks-per-node") == [per_node]
        assert _opt(argv, "--nodes") == [str(len(nodes.split(",")))]
        assert _opt(argv, "--job-name") == [f"byteps-{spec.role}-{IDENTITY.job_id}"]
        env = spec.env
        assert env["DMLC_ROLE"] == spec.role and env["BYTEPS_SECRET"] == IDENTITY.secret
        assert (env["DMLC_NUM_WORKER"], env["DMLC_NUM_SERVER"]) == ("3", "6")
        assert (env["DMLC_PS_ROOT_URI"], env["DMLC_PS_ROOT_PORT"]) == ("10.0.0.1", "1234")
        assert env["PATH"] == "/usr/bin"
        assert not any(IDENTITY.secret in a for a in argv)  # the secret travels in the env only
    assert sched.argv[-1:] == ["server-bin"] and server.argv[-1:] == ["server-bin"]
    assert "--overcommit" in server.argv and "--overcommit" not in worker.argv
    i = worker.argv.index("/venv/bin/python")
    assert worker.argv[i:] == ["/venv/bin/python", "-m", "byteps.launch.slurm_task", "--", "python",
                               "train.py", "--epochs", "3"]
    assert worker.env["BYTEPS_LOCAL_SIZE"] == "2"


def test_plan_passes_cpus_per_task_and_interface_and_extra_env():
    *_, worker = _plan(base={"SLURM_CPUS_PER_TASK": "4", "DMLC_INTERFACE": "ib0"},
                       extra_env={"FOO": "bar"})
    assert _opt(worker.argv, "--cpus-per-task") == ["4"]
    assert worker.env["DMLC_INTERFACE"] == "ib0" and worker.env["FOO"] == "bar"
    *_, worker = _plan(base={"SLURM_CPUS_PER_TASK": "4", "SRUN_CPUS_PER_TASK": "2"})
    assert _opt(worker.argv, "--cpus-per-task") == []  # srun takes SRUN_CPUS_PER_TASK itself


@pytest.mark.parametrize("kw, message", [
    ({"servers_per_node": 0}, "--servers-per-node must be >= 1"),
    ({"port": 0}, "--port must be in 1..65535"),
])
def test_plan_errors(kw, message):
    alloc = ls.SlurmAllocation("42", ("n0",), 1, None)
    args = {"scheduler_host": "n0", "port": 1234, **kw}
    with pytest.raises(LaunchError, match=message):
        ls.build_slurm_plan(alloc, ["x"], **args)
    with pytest.raises(LaunchError, match="no COMMAND"):
        ls.build_slurm_plan(alloc, [], scheduler_host="n0", port=1234)


# ---------------------------------------------------------------------- failure reporting --


def test_task_failure_watch_names_the_first_failed_task():
    out = io.StringIO()
    watch = ls.TaskFailureWatch(out)
    watch.write("[worker] 1: rank 1 exits with 3\n")
    watch.write("[worker] srun: error: n1: task 1: Exited with exit code 3\n"
                "[worker] srun: error: n0: task 0: Terminated\n")
    watch.write("[server] srun: error: n0: tasks 0-1: Exited with exit code 1\n")
    assert not watch.failed
    watch.write("bpslaunch: worker (pid 5) exited with code 143; stopping the job\n")
    assert watch.failed
    assert watch.describe() == "worker rank 1 on node n1: Exited with exit code 3"
    assert watch.exit_code() == 3
    assert out.getvalue().count("\n") == 5  # everything passed on


def test_task_failure_watch_signals_and_ranges():
    watch = ls.TaskFailureWatch(io.StringIO())
    assert watch.describe() is None and watch.exit_code() is None
    watch.write("[server] srun: error: n2: tasks 2,4: Killed\n")
    assert watch.describe() == "servers 2,4 on node n2: Killed"
    assert watch.exit_code() is None


# --------------------------------------------------------------------------- slurm_task --


def _task(**kw):
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "3",
           "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "1234", "BYTEPS_LOCAL_SIZE": "2",
           "BYTEPS_JOB_ID": IDENTITY.job_id, "BYTEPS_SECRET": IDENTITY.secret,
           "DMLC_WORKER_ID": "0", "BYTEPS_LOCAL_RANK": "0", "SLURM_NODEID": "2",
           "SLURM_LOCALID": "1", "KEEP": "me"}
    env.update(kw)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_task_maps_node_and_local_ids():
    env = slurm_task.task_env(_task(DMLC_INTERFACE="ib0"))
    assert (env["DMLC_WORKER_ID"], env["BYTEPS_LOCAL_RANK"]) == ("2", "1")
    assert env["DMLC_ROLE"] == "worker" and env["BYTEPS_LOCAL_SIZE"] == "2"
    assert env["BYTEPS_SECRET"] == IDENTITY.secret and env["KEEP"] == "me"
    assert env["DMLC_INTERFACE"] == "ib0"


@pytest.mark.parametrize("kw, message", [
    ({"SLURM_NODEID": None}, "SLURM_NODEID is not set"),
    ({"SLURM_LOCALID": "x"}, "SLURM_LOCALID='x' is not an integer"),
    ({"SLURM_NODEID": "3"}, r"SLURM_NODEID=3, SLURM_LOCALID=1: worker_id 3 is not in 0\.\.2"),
    ({"SLURM_LOCALID": "2"}, r"local_rank 2 is not in 0\.\.1"),
    ({"BYTEPS_SECRET": None}, "BYTEPS_SECRET is not set"),
])
def test_slurm_task_errors(kw, message):
    with pytest.raises(slurm_task.SlurmTaskError, match=message):
        slurm_task.task_env(_task(**kw))


def test_slurm_task_execs_the_command_with_the_task_environment():
    code = ("import os; print(os.environ['DMLC_WORKER_ID'], os.environ['BYTEPS_LOCAL_RANK'], "
            "os.environ['KEEP'])")
    env = {**os.environ, **_task()}
    res = subprocess.run([sys.executable, "-m", "byteps.launch.slurm_task", "--", sys.executable, "-c",
                          code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["2", "1", "me"]
    res = subprocess.run([sys.executable, "-m", "byteps.launch.slurm_task", "/nonexistent/cmd"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 127 and "cannot run '/nonexistent/cmd'" in res.stderr
    res = subprocess.run([sys.executable, "-m", "byteps.launch.slurm_task", "true"],
                         env={**os.environ, **_task(SLURM_NODEID=None)}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "byteps.launch.slurm_task: SLURM_NODEID is not set" in res.stderr


# ------------------------------------------------------------------------- mode selection --


def _main(argv, env, capsys):
    rc = main(argv, env=env)
    return rc, capsys.readouterr().err


def test_slurm_outside_an_allocation_is_a_usage_error(capsys):
    rc, err = _main(["--slurm", "python", "x.py"], {"PATH": os.environ["PATH"]}, capsys)
    assert rc == 2 and "SLURM_JOB_ID is not set" in err


@pytest.mark.parametrize("argv, message", [
    (["--servers-per-node", "2", "python", "x.py"], "--servers-per-node: only with --slurm"),
    (["--slurm", "--workers", "2", "python", "x.py"], "--workers: not with --slurm"),
    (["--slurm", "--local-size", "2", "--servers", "1", "x"], "--servers, --local-size: not"),
])
def test_slurm_option_clashes(argv, message, capsys):
    rc, err = _main(argv, {"PATH": os.environ["PATH"]}, capsys)
    assert rc == 2 and message in err


def test_detected_inside_an_allocation_and_said_so(capsys, tmp_path):
    """SLURM_JOB_ID without DMLC_ROLE selects --slurm (here scontrol is missing: exit 2)."""
    env = {"PATH": str(tmp_path), "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n0",
           "SLURM_TASKS_PER_NODE": "1"}
    rc, err = _main(["python", "x.py"], env, capsys)
    assert "SLURM_JOB_ID=9 is set and DMLC_ROLE is not" in err
    assert rc == 2 and "scontrol not found" in err
    # with DMLC_ROLE the environment describes one role: upstream mode, not Slurm
    rc, err = _main(["python", "x.py"], {**env, "DMLC_ROLE": "worker"}, capsys)
    assert "SLURM_JOB_ID" not in err and rc == 2 and "DMLC_NUM_WORKER is not set" in err


def test_cancel_steps_cancels_only_the_jobs_own_steps_still_listed():
    calls = []

    def run(argv):
        calls.append(list(argv))
        if argv[0] == "squeue":
            return ("42.batch batch\n42.0 byteps-scheduler-abc\n42.2 byteps-worker-abc\n"
                    "42.3 byteps-worker-other\n42.4 user-step\n")
        return ""

    names = [ls.step_name(r, "abc") for r in ("scheduler", "server", "worker")]
    assert ls.cancel_steps("42", names, run) == ["42.0", "42.2"]
    assert calls[0] == ["squeue", "-h", "-s", "-j", "42", "-o", "%i %j"]
    assert calls[1] == ["scancel", "--quiet", "42.0", "42.2"]
    calls.clear()
    assert ls.cancel_steps("42", ["byteps-server-abc"], run) == []
    assert [c[0] for c in calls] == ["squeue"]  # nothing to cancel: no scancel
