"""``bpslaunch --k8s-manifest`` against the Kubernetes schema and, pod by pod, on emulated hosts.

There is no Kubernetes cluster here. Two checks stand in for one:

* every generated object is validated (strict: unknown fields fail too) against the OpenAPI
  schema of Kubernetes :data:`K8S_VERSION` with ``kubernetes_validate``, for several (N, K, L);
* the contract end to end: the YAML is parsed, and for each pod (scheduler, K servers, N
  workers) tests/k8s_pods.py computes what a kubelet would start (environment from the Secret,
  the completion index, the pod IP and the plain values; the command). Each pod is a
  network-namespace host (``benchmarks.netns.EmulatedCluster``, unshaped) whose /etc/hosts
  resolves the scheduler Service's names (``NAME-scheduler``, ``NAME-scheduler.NS.svc``,
  ``...svc.cluster.local``) to the scheduler pod's address, as cluster DNS would -- but only
  from the moment the scheduler "pod" starts: the servers' and workers' init containers start
  first and must wait for the name. The workers then run a push_pull job (exact sums) or the
  digits example, and every pod must exit 0: the scheduler and servers end by themselves when
  the workers finish, so the three Jobs would complete.

Needs root and iproute2 (skipped otherwise), PyYAML and kubernetes-validate (the ``engines``
extra), and ``python``/``bpslaunch`` next to this interpreter (the pods' image stands in for
this installation).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from k8s_pods import Pod, pods_of

from benchmarks import netns
from byteps.launch import cli

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux"),
]
yaml = pytest.importorskip("yaml", reason="PyYAML (the engines extra) is not installed")
kv = pytest.importorskip("kubernetes_validate",
                         reason="kubernetes-validate (the engines extra) is not installed")

#: The Kubernetes version whose schema the manifests are validated against (Indexed Jobs and
#: the completion-index annotation are GA since 1.24 and 1.28).
K8S_VERSION = "1.30"
REPO = Path(__file__).resolve().parents[1]
BINDIR = os.path.dirname(sys.executable)


def generate(tmp_path: Path, options: list[str], command: list[str]) -> list[dict]:
    """``bpslaunch --k8s-manifest OPTIONS -o FILE COMMAND``, parsed."""
    out = tmp_path / "job.yaml"
    rc = cli.main(["--k8s-manifest", *options, "-o", str(out), *command], env={})
    assert rc == 0
    return list(yaml.safe_load_all(out.read_text()))


@pytest.mark.parametrize("options", [
    ["--workers", "2", "--servers", "1"],
    ["--workers", "3", "--servers", "2", "--local-size", "2", "--namespace", "ml"],
    ["--workers", "8", "--servers", "4", "--local-size", "8", "--cpu", "16", "--memory",
     "64Gi", "--gpus", "8", "--port", "1234", "--name", "resnet50"],
    ["--workers", "1", "--local-size", "4"],
    ["--workers", "1", "--servers", "2", "--env", "BYTEPS_FORCE_DISTRIBUTED=1", "--env",
     "BYTEPS_TIMEOUT=600"],
])
def test_every_object_validates_against_the_kubernetes_schema(tmp_path, options):
    docs = generate(tmp_path, [*options, "--image", "registry.example/byteps:1.0"],
                    ["python", "train.py", "--lr", "$(LR)"])
    assert len(docs) in (2, 5)
    for doc in docs:
        assert kv.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION, doc["kind"]


def test_the_schema_validation_is_real(tmp_path):
    docs = generate(tmp_path, ["--workers", "2", "--image", "img"], ["python", "t.py"])
    job = docs[-1]
    job["spec"]["template"]["spec"]["containers"][0]["envv"] = []  # unknown field
    with pytest.raises(kv.ValidationError):
        kv.validate(job, K8S_VERSION, strict=True)
    docs[-1]["spec"]["template"]["spec"]["containers"][0].pop("envv")
    docs[-1]["spec"]["completions"] = "two"  # wrong type
    with pytest.raises(kv.ValidationError):
        kv.validate(docs[-1], K8S_VERSION, strict=True)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(argv, env={})
    return rc, out.getvalue(), err.getvalue()


GOOD = ["--k8s-manifest", "--workers", "2", "--image", "img:1"]


def test_output_file_is_private_and_holds_every_object(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("old")
    path.chmod(0o644)
    rc, out, err = run_main(GOOD + ["--name", "digits", "-o", str(path), "--", "python",
                                    "--version"])
    assert rc == 0 and out == "" and "wrote 5 Kubernetes objects of job digits" in err
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert text.startswith("# byteps job digits") and "&id" not in text
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["Secret", "Service", "Job", "Job", "Job"]
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "bpslaunch", "--", "python", "--version"]
    rc, out, err = run_main(GOOD + ["python", "t.py"])
    assert rc == 0 and list(yaml.safe_load_all(out))[1]["kind"] == "Service"


# ------------------------------------------------------------------------ pods on hosts --


class EmulatedPods:
    """The pods of one manifest on the hosts of an :class:`netns.EmulatedCluster`: workers on
    w0.., the scheduler on s0, the servers on s1..; each host's /etc/hosts through
    ``/etc/netns/<netns>/hosts`` (removed by :meth:`close`, with what was created for it)."""

    def __init__(self, docs: list[dict], workers: int, servers: int, namespace: str,
                 logdir: Path) -> None:
        self.cluster = netns.EmulatedCluster(workers, servers + 1, 0)
        self.logdir, self.namespace = logdir, namespace
        self._created: list[Path] = []  # files and directories, in creation order
        self._logs: list = []
        self.service = next(d for d in docs if d["kind"] == "Service")["metadata"]["name"]
        try:
            self.hosts = {"scheduler": [self.cluster.host("s0")],
                          "server": [self.cluster.host(f"s{j + 1}") for j in range(servers)],
                          "worker": [self.cluster.host(f"w{i}") for i in range(workers)]}
            image_env = {"PATH": f"{BINDIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                                 "/sbin:/bin", "HOME": str(logdir), "LANG": "C.UTF-8"}
            if os.environ.get("PYTHONPATH"):
                image_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            self.pods = pods_of(docs, lambda role, i: self.hosts[role][i].address, image_env,
                                default_namespace=namespace)
            self.write_hosts(service=False)
        except BaseException:
            self.close()
            raise

    def host_of(self, pod: Pod):
        return self.hosts[pod.role][pod.index or 0]

    def write_hosts(self, service: bool) -> None:
        """Every host's /etc/hosts: itself, and the Service names once ``service`` (rewritten
        in place: ``ip netns exec`` bind-mounts the file, so a new inode would go unseen)."""
        sched = self.hosts["scheduler"][0].address
        svc = self.service
        names = f"{svc} {svc}.{self.namespace}.svc {svc}.{self.namespace}.svc.cluster.local"
        for pod in self.pods:
            host = self.host_of(pod)
            lines = ["127.0.0.1\tlocalhost", f"{host.address}\t{pod.hostname}"]
            if service:
                lines.append(f"{sched}\t{names}")
            path = Path("/etc/netns") / host.netns / "hosts"
            for d in (path.parent.parent, path.parent):
                if not d.exists():
                    d.mkdir(mode=0o755)
                    self._created.append(d)
            if not path.exists():
                self._created.append(path)
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")

    def start(self, pod: Pod, container) -> subprocess.Popen:
        log = open(self.logdir / f"{pod.hostname}.{container.name}.log", "wb")
        self._logs.append(log)
        return self.cluster.spawn(self.host_of(pod), container.argv, env=container.env,
                                  cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT)

    def log(self, pod: Pod, container) -> str:
        return (self.logdir / f"{pod.hostname}.{container.name}.log").read_text(errors="replace")

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            for f in self._logs:
                f.close()
            for p in reversed(self._created):
                with contextlib.suppress(OSError):
                    p.rmdir() if p.is_dir() else p.unlink()


def wait(proc: subprocess.Popen, seconds: float) -> int | None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.wait(seconds)
    return None


@pytest.fixture
def runtime():
    reason = netns.netns_unavailable()
    if reason:
        pytest.skip(f"emulated cluster unavailable: {reason}")
    for tool in ("python", "bpslaunch"):
        if shutil.which(tool, path=BINDIR) is None:
            pytest.skip(f"no {tool} next to {sys.executable} (the pods' image)")
    pytest.importorskip("byteps._core", reason="the byteps core is not built")


def start_job(tmp_path: Path, workers: int, servers: int, local: int, command: list[str],
              extra: Sequence[str] = ()) -> tuple[EmulatedPods, dict]:
    """Generate and validate the manifest, then start its pods as a cluster would, in the
    least convenient order: the servers' and workers' init containers first (they must wait
    for the scheduler's name), then the scheduler with its DNS record, then each main
    container once its init container succeeded. Returns the pods and the main containers
    ``{(role, index): (pod, process)}``."""
    ns = "ml"
    docs = generate(tmp_path, ["--workers", str(workers), "--servers", str(servers),
                               "--local-size", str(local), "--namespace", ns, "--image",
                               "registry.example/byteps:test", "--name", "job", *extra], command)
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)
    emu = EmulatedPods(docs, workers, servers, ns, tmp_path)
    try:
        (sched,) = [p for p in emu.pods if p.role == "scheduler"]
        others = [p for p in emu.pods if p.role != "scheduler"]
        assert all(len(p.init) == 1 and len(p.main) == 1 for p in others)
        inits = [(p, emu.start(p, p.init[0])) for p in others]
        time.sleep(1.5)
        for p, proc in inits:  # no DNS record yet: every init container waits
            assert proc.poll() is None, f"{p.hostname}: {emu.log(p, p.init[0])}"
        emu.write_hosts(service=True)  # the scheduler pod gets its address: the record appears
        mains = {("scheduler", None): (sched, emu.start(sched, sched.main[0]))}
        for p, proc in inits:
            rc = wait(proc, 15)
            out = emu.log(p, p.init[0])
            assert rc == 0, f"{p.hostname} init: rc {rc}\n{out}"
            assert f"resolves to {emu.hosts['scheduler'][0].address}" in out
            mains[(p.role, p.index)] = (p, emu.start(p, p.main[0]))
        return emu, mains
    except BaseException:
        emu.close()
        raise


def all_logs(emu: EmulatedPods, mains: dict) -> str:
    return "\n".join(f"--- {p.hostname}\n{emu.log(p, p.main[0])[-3000:]}"
                     for p, _ in mains.values())


def run_job(tmp_path: Path, workers: int, servers: int, local: int, command: list[str],
            extra: Sequence[str] = (), deadline: float = 60.0) -> tuple[EmulatedPods, dict]:
    """:func:`start_job`, then every main container must exit 0: the workers within
    ``deadline`` seconds, the scheduler and servers by themselves within 10 s after them (so
    their Jobs complete). Returns the pods and the main containers' logs by (role, index)."""
    emu, mains = start_job(tmp_path, workers, servers, local, command, extra)
    try:
        end = time.monotonic() + deadline
        for key in sorted(mains, key=lambda key: key[0] != "worker"):  # workers first
            pod, proc = mains[key]
            rc = wait(proc, max(end - time.monotonic(), 0.1) if key[0] == "worker" else 10.0)
            assert rc == 0, f"{pod.hostname} ({key}): rc {rc}\n{all_logs(emu, mains)}"
        logs = {key: emu.log(pod, pod.main[0]) for key, (pod, _) in mains.items()}
        return emu, logs
    except BaseException:
        emu.close()
        raise


def assert_cleaned(emu: EmulatedPods) -> None:
    namespaces = list(emu.cluster.namespaces) or [h.netns for hs in emu.hosts.values()
                                                  for h in hs]
    emu.close()
    assert not any(ns in netns.list_netns() for ns in namespaces)
    assert not any((Path("/etc/netns") / ns).exists() for ns in namespaces)


@pytest.mark.timeout(120)
def test_push_pull_job_runs_pod_by_pod(tmp_path, runtime):
    n, k, local = 2, 2, 2
    emu, logs = run_job(tmp_path, n, k, local,
                        ["python", "tests/workers/bps_worker.py", "correctness", "--no-big"])
    try:
        for i in range(n):  # pod i runs global ranks i*L .. i*L+L-1 (DMLC_WORKER_ID = index)
            out = logs[("worker", i)]
            starts = re.findall(r"^\[worker (\d+)\] START mode=correctness rank=(\d+) "
                                r"size=(\d+) local_rank=(\d+) local_size=(\d+)", out, re.M)
            assert sorted(starts) == [(str(r), str(r), str(n * local), str(lr), str(local))
                                      for lr, r in enumerate(range(i * local, (i + 1) * local))]
            oks = re.findall(r"^\[worker (\d+)\] OK \d+ cases$", out, re.M)
            assert sorted(oks) == [str(r) for r in range(i * local, (i + 1) * local)], out[-2000:]
    finally:
        assert_cleaned(emu)


@pytest.mark.timeout(150)
def test_digits_trains_across_worker_pods(tmp_path, runtime):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    n, k, local = 3, 1, 1
    emu, logs = run_job(tmp_path, n, k, local,
                        ["python", "examples/torch/train_digits.py", "--epochs", "1"],
                        extra=["--env", "OMP_NUM_THREADS=1"], deadline=90)
    try:
        out = logs[("worker", 0)]
        assert f"parameters identical on all {n * local} workers" in out, out[-3000:]
        accuracy = float(re.search(r"final test accuracy: ([0-9.]+)", out).group(1))
        assert accuracy > 0.8, out[-2000:]
    finally:
        assert_cleaned(emu)


@pytest.mark.timeout(60)
def test_init_container_gives_up_when_the_name_never_resolves(tmp_path, runtime):
    docs = generate(tmp_path, ["--workers", "2", "--image", "img", "--name", "job", "--env",
                               "BYTEPS_TIMEOUT=1"], ["python", "t.py"])
    emu = EmulatedPods(docs, 2, 1, "default", tmp_path)
    try:
        pod = next(p for p in emu.pods if p.role == "worker")
        t0 = time.monotonic()
        proc = emu.start(pod, pod.init[0])
        rc = wait(proc, 20)
        out = emu.log(pod, pod.init[0])
        assert rc == 1 and "did not resolve within 1 s (BYTEPS_TIMEOUT)" in out, (rc, out)
        assert time.monotonic() - t0 < 15
    finally:
        assert_cleaned(emu)


# A training loop that does not catch byteps' errors (a worker pod's command, multi-line).
LOOP = """
import numpy as np
import byteps.basics as bps
bps.init()
x = np.ones(4096, np.float32)
y = np.empty_like(x)
for step in range(100000):
    bps.wait(bps.push_pull_async("g", x.ctypes.data, y.ctypes.data, x.nbytes, "float32",
                                 x.shape, False))
    if step == 0:
        print("READY", flush=True)
"""


@pytest.mark.timeout(90)
def test_a_lost_worker_pod_fails_every_pod(tmp_path, runtime):
    """A worker pod killed mid-job (node lost, OOM-killed): every other pod exits non-zero
    soon after, so every Job fails (backoffLimit 0) instead of hanging."""
    emu, mains = start_job(tmp_path, 2, 1, 1, ["python", "-c", LOOP],
                           extra=["--env", "BYTEPS_HEARTBEAT_TIMEOUT=5"])
    try:
        deadline = time.monotonic() + 30
        while not all("READY" in emu.log(p, p.main[0])
                      for (role, _), (p, _) in mains.items() if role == "worker"):
            assert time.monotonic() < deadline, all_logs(emu, mains)
            for key, (_, proc) in mains.items():
                assert proc.poll() is None, f"{key} ended early\n{all_logs(emu, mains)}"
            time.sleep(0.2)
        lost = mains[("worker", 1)][1]
        os.killpg(lost.pid, signal.SIGKILL)  # the pod's processes, all at once
        t0 = time.monotonic()
        for key, (_, proc) in mains.items():
            rc = wait(proc, max(t0 + 30 - time.monotonic(), 0.1))
            assert rc is not None and rc != 0, f"{key}: rc {rc}\n{all_logs(emu, mains)}"
        print(f"every pod ended {time.monotonic() - t0:.1f} s after worker pod 1 was killed")
        survivor = mains[("worker", 0)][0]
        assert "PeerLostError" in emu.log(survivor, survivor.main[0])
    finally:
        assert_cleaned(emu)
