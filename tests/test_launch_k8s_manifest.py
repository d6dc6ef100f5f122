"""``bpslaunch --k8s-manifest`` without a cluster, YAML or namespaces: the objects as dicts.

The structure (names, labels, indexes, lifetime), the secret (in the Secret only, never in a
command), and the contract: for every pod, the environment a kubelet would give it
(tests/k8s_pods.py) is exactly :func:`byteps.launch.contract.role_env`'s for that pod, also after
the worker pod's ``bpslaunch`` has split it into local ranks. Bad input exits 2. The schema
validation and the end-to-end run are in tests/test_launch_k8s.py (``engines``).
"""

from __future__ import annotations

import base64
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from k8s_pods import K8sEmulationError, expand, pods_of

from byteps.launch import cli, k8s
from byteps.launch.common import LaunchError
from byteps.launch.contract import CONTRACT_VARS, ClusterSpec, JobIdentity, role_env
from byteps.launch.k8s import build_manifests
from byteps.launch.upstream import build_upstream_plan, validate_upstream_env

IDENTITY = JobIdentity("0123456789ab", "f" * 8 + "e" * 56)
COMMAND = ["python", "train.py", "--epochs", "3"]
IMAGE = {"workers": 3, "servers": 2, "local_size": 2, "image": "registry.example/byteps:1"}


def ip_of(role: str, index: int) -> str:
    return {"scheduler": "10.0.0.2", "server": f"10.0.1.{index + 2}",
            "worker": f"10.0.2.{index + 2}"}[role]


def manifests(**kw):
    args = {**IMAGE, "command": COMMAND, "name": "mnist", "identity": IDENTITY, **kw}
    return build_manifests(**args)


def contract(env: dict) -> dict:
    return {k: v for k, v in env.items() if k in CONTRACT_VARS}


@pytest.mark.parametrize("n,k,local", [(2, 1, 1), (3, 2, 2), (4, 4, 8), (1, 1, 3)])
def test_objects_names_labels_and_lifetime(n, k, local):
    forced = {"BYTEPS_FORCE_DISTRIBUTED": "1"} if n == 1 else {}
    docs = manifests(workers=n, servers=k, local_size=local, namespace="ml", extra_env=forced)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Secret", "mnist-secret"), ("Service", "mnist-scheduler"), ("Job", "mnist-scheduler"),
        ("Job", "mnist-server"), ("Job", "mnist-worker")]
    for d in docs:
        assert d["metadata"]["namespace"] == "ml"
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == "mnist"
    secret, service, *jobs = docs
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == k8s.DEFAULT_PORT
    pods = {j["metadata"]["labels"]["app.kubernetes.io/component"]: j for j in jobs}
    assert list(pods) == ["scheduler", "server", "worker"]
    for role, j in pods.items():
        selected = all(j["spec"]["template"]["metadata"]["labels"].get(key) == value
                       for key, value in service["spec"]["selector"].items())
        assert selected == (role == "scheduler"), role  # the Service names the scheduler only
        spec, pod = j["spec"], j["spec"]["template"]["spec"]
        assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
        assert pod["enableServiceLinks"] is False
        assert spec["completions"] == spec["parallelism"] == {"scheduler": 1, "server": k,
                                                              "worker": n}[role]
        assert spec.get("completionMode") == (None if role == "scheduler" else "Indexed")
        main = pod["containers"][0]
        want = ["bpslaunch", "--", *COMMAND] if role == "worker" else [
            "python", "-m", "byteps.server"]
        assert main["command"] == want and "args" not in main
        assert main["image"] == IMAGE["image"]
        init = pod.get("initContainers", [])
        assert [c["name"] for c in init] == ([] if role == "scheduler" else
                                             ["wait-for-scheduler"])
    worker_pod = pods["worker"]["spec"]["template"]["spec"]
    assert worker_pod["containers"][0]["volumeMounts"] == [{"name": "dshm",
                                                            "mountPath": "/dev/shm"}]
    assert worker_pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


@pytest.mark.parametrize("n,k,local", [(2, 1, 1), (3, 2, 2), (5, 3, 4)])
def test_every_pod_gets_the_role_env_contract(n, k, local):
    docs = manifests(workers=n, servers=k, local_size=local, extra_env={"BYTEPS_TIMEOUT": "60"})
    image_env = {"PATH": "/usr/bin:/bin", "BYTEPS_JOB_ID": "stale-from-image"}
    pods = pods_of(docs, ip_of, image_env)
    assert [(p.role, p.index) for p in pods] == (
        [("scheduler", None)] + [("server", j) for j in range(k)] +
        [("worker", i) for i in range(n)])
    spec = ClusterSpec(n, k, local, "mnist-scheduler", k8s.DEFAULT_PORT, IDENTITY)
    extra = {"BYTEPS_TIMEOUT": "60"}
    for pod in pods:
        (main,) = pod.main
        env = main.env
        assert env["PATH"] == "/usr/bin:/bin" and env["BYTEPS_TIMEOUT"] == "60"
        assert validate_upstream_env(env) == [], pod
        if pod.role == "scheduler":
            # The scheduler binds its own address: its pod IP, which the Service name resolves to.
            want = {**role_env(spec, "scheduler", base=extra), "DMLC_PS_ROOT_URI": pod.ip}
            assert contract(env) == contract(want)
            assert "DMLC_NODE_HOST" not in env
        elif pod.role == "server":
            want = role_env(spec, "server", node_host=pod.ip, base=extra)
            assert contract(env) == contract(want) and env["DMLC_PORT"] == str(spec.scheduler_port)
        else:
            # bpslaunch (upstream mode) in the worker pod: one process per local rank.
            assert main.argv[:2] == ["bpslaunch", "--"]
            children = build_upstream_plan(env, main.argv[2:], server_argv=["unused"])
            assert [c.rank for c in children] == [spec.rank(pod.index, lr) for lr in range(local)]
            for lr, child in enumerate(children):
                want = role_env(spec, "worker", worker_id=pod.index, local_rank=lr,
                                node_host=pod.ip, base=extra)
                assert contract(child.env) == contract(want)
                assert child.argv == COMMAND
            assert env["JOB_COMPLETION_INDEX"] == str(pod.index)
        for init in pod.init:
            assert init.env["DMLC_PS_ROOT_URI"] == "mnist-scheduler"
            assert init.env["BYTEPS_TIMEOUT"] == "60"
            assert init.argv[:2] == ["python", "-c"]
            assert init.argv[2] == k8s.WAIT_FOR_SCHEDULER


def test_the_secret_is_only_in_the_secret_object():
    docs = manifests(extra_env={"OMP_NUM_THREADS": "1"})
    text = json.dumps(docs)
    assert IDENTITY.secret not in text  # base64 in the Secret, referenced elsewhere
    encoded = base64.b64encode(IDENTITY.secret.encode()).decode()
    assert [d["kind"] for d in docs if encoded in json.dumps(d)] == ["Secret"]
    for d in docs[2:]:
        pod = d["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            assert "args" not in c
            assert not any(encoded in a or "BYTEPS_SECRET" in a for a in c["command"])
            for e in c["env"]:
                if e["name"] == "BYTEPS_SECRET":
                    assert e == {"name": "BYTEPS_SECRET", "valueFrom": {"secretKeyRef": {
                        "name": "mnist-secret", "key": k8s.SECRET_KEY}}}
    # a fresh secret per manifest
    a, b = (build_manifests(**IMAGE, command=COMMAND)[0]["data"] for _ in range(2))
    assert a != b


def test_dollars_reach_the_process_unchanged():
    assert expand("$(A)-$$(A)-$$-$(B)-$x-$", {"A": "1"}) == "1-$(A)-$-$(B)-$x-$"
    tricky = ["sh", "-c", "echo $HOME $(hostname) $$ $(A) $$(A) end$"]
    docs = manifests(command=tricky, extra_env={"A": "x$(B)$$", "B": "b"})
    pods = pods_of(docs, ip_of, {"HOME": "/root"})
    worker = [p for p in pods if p.role == "worker"][0].main[0]
    assert worker.argv == ["bpslaunch", "--", *tricky]
    assert worker.env["A"] == "x$(B)$$" and worker.env["B"] == "b"


def test_one_worker_pod_without_forcing_has_no_scheduler_or_servers():
    docs = manifests(workers=1, servers=2, local_size=4)
    assert [d["kind"] for d in docs] == ["Secret", "Job"]
    (pod,) = pods_of(docs, ip_of, {})
    assert pod.init == []
    assert pod.main[0].env["DMLC_NUM_SERVER"] == "0"
    assert validate_upstream_env(pod.main[0].env) == []


def test_resources_namespace_and_default_name():
    docs = build_manifests(**IMAGE, command=COMMAND, identity=IDENTITY, cpu="500m",
                           memory="8Gi", gpus=2, port=1234)
    assert docs[0]["metadata"]["name"] == f"byteps-{IDENTITY.job_id}-secret"
    assert all("namespace" not in d["metadata"] for d in docs)
    worker = docs[-1]["spec"]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"requests": {"cpu": "500m", "memory": "8Gi"},
                                   "limits": {"cpu": "500m", "memory": "8Gi",
                                              "nvidia.com/gpu": 2}}
    for d in docs[2:4]:
        assert "resources" not in d["spec"]["template"]["spec"]["containers"][0]
    server = docs[3]["spec"]["template"]["spec"]["containers"][0]
    assert server["ports"] == [{"name": "server", "containerPort": 1234, "protocol": "TCP"}]


def test_the_emulation_refuses_what_it_does_not_know():
    docs = manifests()
    docs[-1]["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    with pytest.raises(K8sEmulationError, match="spec.nodeName"):
        pods_of(docs, ip_of, {})
    docs = manifests()
    docs[0]["metadata"]["name"] = "other"
    with pytest.raises(K8sEmulationError, match="CreateContainerConfigError"):
        pods_of(docs, ip_of, {})


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(argv, env={})
    return rc, out.getvalue(), err.getvalue()


GOOD = ["--k8s-manifest", "--workers", "2", "--image", "img:1"]


@pytest.mark.parametrize("argv,message", [
    (GOOD + ["--name", "MNIST", "python", "t.py"], "--name 'MNIST'"),
    (GOOD + ["--name", "1job", "python", "t.py"], "starting with a letter"),
    (GOOD + ["--name", "a" * 41, "python", "t.py"], "at most 40"),
    (GOOD + ["--name", "job-", "python", "t.py"], "--name"),
    (GOOD + ["--namespace", "Team_A", "python", "t.py"], "--namespace"),
    (["--k8s-manifest", "--workers", "0", "--image", "i", "python"], "--workers must be >= 1"),
    (GOOD + ["--servers", "0", "python", "t.py"], "--servers 0"),
    (GOOD + ["--local-size", "0", "python", "t.py"], "--local-size must be >= 1"),
    (GOOD + ["--port", "70000", "python", "t.py"], "--port must be in 1..65535"),
    (GOOD, "no COMMAND"),
    (GOOD + ["--"], "no COMMAND"),
    (["--k8s-manifest", "--workers", "2", "python", "t.py"], "needs --image"),
    (["--k8s-manifest", "--workers", "2", "--image", "a b", "python"], "--image 'a b'"),
    (["--k8s-manifest", "--image", "i", "python", "t.py"], "needs --workers"),
    (GOOD + ["--env", "DMLC_WORKER_ID=3", "python"], "DMLC_WORKER_ID"),
    (GOOD + ["--env", "NOVALUE", "python"], "NOVALUE"),
    (GOOD + ["--cpu", "lots", "python"], "--cpu 'lots'"),
    (GOOD + ["--memory", "8GB", "python"], "--memory '8GB'"),
    (GOOD + ["--gpus", "0", "python"], "--gpus must be >= 1"),
    (GOOD + ["--doctor", "python"], "--doctor: not with --k8s-manifest"),
    (GOOD + ["--slurm", "python"], "--slurm: not with --k8s-manifest"),
    (["--workers", "2", "--image", "i", "python"], "--image only apply with --k8s-manifest"),
    (["--name", "x", "--namespace", "y", "python"], "--name, --namespace only apply"),
])
def test_bad_input_exits_2_with_a_message(argv, message):
    rc, out, err = run_main(argv)
    assert rc == 2, (out, err)
    assert err.startswith("bpslaunch: ") and message in err, err
    assert "Traceback" not in err and out == ""


def test_without_pyyaml_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    with pytest.raises(LaunchError, match="needs PyYAML"):
        k8s.render_yaml(manifests())
    rc, out, err = run_main(GOOD + ["python", "t.py"])
    assert rc == 2 and "needs PyYAML" in err and out == ""
