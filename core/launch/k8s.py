"""``bpslaunch --k8s-manifest``: the Kubernetes objects of a byteps job, as YAML.

``bpslaunch --k8s-manifest --workers N [--servers K] [--local-size L] --image IMAGE
[--name NAME] [--namespace NS] [--port P] [--env KEY=VAL] [--cpu Q] [--memory Q] [--gpus G]
[-o FILE] COMMAND ...`` writes (stdout, or FILE with mode 0600) five documents:

1. a ``Secret`` ``NAME-secret`` holding a fresh job secret (key ``secret``); every pod reads it
   through ``secretKeyRef``, so it is in no command line and no other object;
2. a headless ``Service`` ``NAME-scheduler`` (``clusterIP: None``, ``publishNotReadyAddresses``)
   selecting the scheduler pod: its name is ``DMLC_PS_ROOT_URI``, as in Kubeflow's operator for
   BytePS (the servers and workers find each other through the scheduler, so no other Service);
3. a ``Job`` ``NAME-scheduler`` (one pod, ``python -m byteps.server``);
4. an Indexed ``Job`` ``NAME-server`` (K pods, ``python -m byteps.server``, listening on P);
5. an Indexed ``Job`` ``NAME-worker`` (N pods; pod i gets ``DMLC_WORKER_ID=i`` from its
   completion index and runs ``bpslaunch COMMAND`` in upstream mode, which starts L local ranks).

Every environment is :func:`byteps.launch.contract.role_env`'s, with the per-pod values turned into
references the kubelet resolves: ``BYTEPS_SECRET`` (``secretKeyRef``), ``DMLC_WORKER_ID`` (the
``batch.kubernetes.io/job-completion-index`` annotation), ``DMLC_NODE_HOST`` of servers and
workers (``status.podIP``) and the scheduler's own ``DMLC_PS_ROOT_URI`` (``status.podIP``: the
address the Service name resolves to, so the scheduler binds without waiting for DNS);
``BYTEPS_LOCAL_RANK`` is left to the worker pod's ``bpslaunch``. Server and worker pods first run
an init container that waits (up to ``BYTEPS_TIMEOUT``, default 120 s) until the Service name
resolves, since their pods may start before the scheduler's DNS record exists (the core would
retry the name too; the init container makes the wait visible as the pod's Init state).

Lifetime: every pod has ``restartPolicy: Never`` and every Job ``backoffLimit: 0`` (a byteps job
cannot survive a lost member). When every worker has called ``shutdown()`` the scheduler tells
the servers to stop and all of them exit 0, so the three Jobs complete; a failed pod makes the
others fail within ``BYTEPS_HEARTBEAT_TIMEOUT`` (default 15 s) and the Jobs fail.

With one worker pod (``N = 1``) and no ``--env BYTEPS_FORCE_DISTRIBUTED=1`` the job needs no
scheduler or servers (as in local mode): only the Secret and the worker Job are written.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import sys
from collections.abc import Mapping, Sequence

from .common import LOCAL_MODE_VARS, LaunchError, check_job_shape, parse_env_pairs
from .contract import ClusterSpec, JobIdentity, role_env

#: Scheduler port when ``--port`` is not given (every server pod also listens on it).
DEFAULT_PORT = 9000
#: Longest ``--name``: the objects are ``NAME-scheduler`` etc., and a pod of an Indexed Job
#: gets the hostname ``NAME-worker-<index>``, which must stay a DNS label (<= 63 characters).
MAX_NAME = 40
#: Key of the job secret inside the Secret ``NAME-secret``.
SECRET_KEY = "secret"
#: The annotation the Job controller puts on each pod of an Indexed Job.
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_FIELD = f"metadata.annotations['{INDEX_ANNOTATION}']"
POD_IP_FIELD = "status.podIP"

#: Options that only ``--k8s-manifest`` reads (argparse dest names).
K8S_ONLY_OPTIONS = ("name", "namespace", "image", "cpu", "memory", "gpus", "output")

#: Options of the other launch modes (argparse dest names): refused with --k8s-manifest.
_OTHER_MODES = ("hosts", "hostfile", "server_hosts", "slurm", "servers_per_node")

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_POD_IP = "<status.podIP>"  # placeholder given to role_env, replaced by a fieldRef

# The init container of server and worker pods: wait until the scheduler's Service name
# resolves (its DNS record appears only once the scheduler pod has an address).
WAIT_FOR_SCHEDULER = """\
import os, socket, sys, time
host = os.environ["DMLC_PS_ROOT_URI"]
limit = float(os.environ.get("BYTEPS_TIMEOUT") or 120)
deadline = time.monotonic() + limit
while True:
    try:
        addr = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        print(f"scheduler {host} resolves to {addr}", flush=True)
        break
    except OSError as exc:
        if time.monotonic() > deadline:
            sys.exit(f"the scheduler's name {host} did not resolve within {limit:g} s "
                     f"(BYTEPS_TIMEOUT): {exc}")
        time.sleep(0.5)
"""


def escape_dollars(text: str) -> str:
    """``text`` with every ``$`` doubled: Kubernetes expands ``$(VAR)`` in a container's
    command, args and env values and turns ``$$`` into ``$``, so the doubled text reaches the
    process exactly as ``text``."""
    return text.replace("$", "$$")


def _check_name(what: str, value: str, pattern: re.Pattern, max_len: int) -> None:
    if not value or len(value) > max_len or not pattern.fullmatch(value):
        raise LaunchError(f"{what} {value!r} must be at most {max_len} characters of [a-z0-9-], "
                          f"starting with a {'letter' if pattern is _DNS1035 else 'letter or digit'}"
                          " and ending with a letter or digit")


def _check_quantity(what: str, value: str | None) -> None:
    if value is not None and not _QUANTITY.fullmatch(value):
        raise LaunchError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")


def _env_list(env: Mapping[str, str], refs: Mapping[str, dict]) -> list[dict]:
    """``env`` as a container's ``env``: the names in ``refs`` become ``valueFrom`` entries,
    the others plain values (``$`` escaped)."""
    missing = set(refs) - set(env)
    # an internal invariant: role_env sets every variable this module turns into a reference
    assert not missing, f"no {sorted(missing)} in the role's environment"
    out = []
    for key, value in env.items():
        if key in refs:
            out.append({"name": key, "valueFrom": refs[key]})
        else:
            assert value != _POD_IP, f"{key} kept the pod-IP placeholder"
            out.append({"name": key, "value": escape_dollars(value)})
    return out


def build_manifests(
    *,
    workers: int,
    servers: int,
    local_size: int,
    image: str,
    command: Sequence[str],
    name: str | None = None,
    namespace: str | None = None,
    port: int = DEFAULT_PORT,
    extra_env: Mapping[str, str] | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    gpus: int | None = None,
    identity: JobIdentity | None = None,
) -> list[dict]:
    """The Kubernetes objects of one byteps job (module docstring), as plain dicts.

    Args:
        workers (int): worker pods N (= upstream's worker machines), >= 1.
        servers (int): server pods K, >= 1 when the job is distributed (``N > 1`` or
            ``BYTEPS_FORCE_DISTRIBUTED=1`` in ``extra_env``); ignored otherwise.
        local_size (int): worker processes per worker pod L (``BYTEPS_LOCAL_SIZE``), >= 1.
        image (str): the container image of every pod (must contain byteps and COMMAND's
            dependencies, with ``python`` and ``bpslaunch`` on its ``PATH``).
        command (Sequence[str]): the worker command, run by ``bpslaunch`` in each worker pod.
        name (str | None): prefix of every object's name, a DNS-1035 label of at most
            :data:`MAX_NAME` characters (default ``byteps-<job id>``).
        namespace (str | None): ``metadata.namespace`` of every object (default: none, i.e.
            kubectl's current namespace).
        port (int): the scheduler's port (``DMLC_PS_ROOT_PORT``), also every server's
            (``DMLC_PORT``); 1..65535. Default :data:`DEFAULT_PORT`.
        extra_env (Mapping[str, str] | None): more variables for every container (``--env``);
            none of :data:`byteps.launch.common.LOCAL_MODE_VARS`.
        cpu (str | None): CPU request and limit of each worker pod (a quantity: ``"4"``,
            ``"500m"``); default none.
        memory (str | None): memory request and limit of each worker pod (``"8Gi"``).
        gpus (int | None): ``nvidia.com/gpu`` limit of each worker pod, >= 1.
        identity (JobIdentity | None): job id and secret (default :meth:`JobIdentity.fresh`).

    Returns:
        list[dict]: Secret, [Service, scheduler Job, server Job,] worker Job.

    Raises:
        LaunchError: a count, port, name, quantity or the image is invalid, COMMAND is empty,
            an ``extra_env`` name is reserved, or K == 0 for a distributed job.
    """
    identity = identity or JobIdentity.fresh()
    name = name if name is not None else f"byteps-{identity.job_id}"
    _check_name("--name", name, _DNS1035, MAX_NAME)
    if namespace is not None:
        _check_name("--namespace", namespace, _DNS1123, 63)
    check_job_shape(workers, servers, local_size, port)
    if not image or image != image.strip() or any(c.isspace() for c in image):
        raise LaunchError(f"--image {image!r} must be a non-empty image reference without spaces")
    if not command:
        raise LaunchError("no COMMAND given (usage: bpslaunch --k8s-manifest --workers N "
                          "--image IMAGE [options] COMMAND ...)")
    _check_quantity("--cpu", cpu)
    _check_quantity("--memory", memory)
    if gpus is not None and gpus < 1:
        raise LaunchError(f"--gpus must be >= 1, got {gpus}")
    extra = dict(extra_env or {})
    reserved = sorted(set(extra) & set(LOCAL_MODE_VARS))
    if reserved:
        raise LaunchError(f"--env {reserved[0]} is set by the manifest itself")
    forced = (extra.get("BYTEPS_FORCE_DISTRIBUTED") or "").strip().lower() in (
        "1", "true", "yes", "on")
    distributed = workers > 1 or forced
    if distributed and servers < 1:
        raise LaunchError(f"--servers {servers} with a distributed job ({workers} worker pods): "
                          "give --servers >= 1")

    service = f"{name}-scheduler"
    secret_name = f"{name}-secret"
    spec = ClusterSpec(workers, servers if distributed else 0, local_size, service, port,
                       identity)
    meta_ns = {"namespace": namespace} if namespace else {}

    def labels(component: str | None = None) -> dict:
        out = {"app.kubernetes.io/name": "byteps", "app.kubernetes.io/instance": name,
               "app.kubernetes.io/managed-by": "bpslaunch"}
        if component:
            out["app.kubernetes.io/component"] = component
        return out

    def meta(obj_name: str, component: str | None = None) -> dict:
        return {"name": obj_name, **meta_ns, "labels": labels(component)}

    secret_ref = {"secretKeyRef": {"name": secret_name, "key": SECRET_KEY}}
    pod_ip = {"fieldRef": {"fieldPath": POD_IP_FIELD}}
    index = {"fieldRef": {"fieldPath": INDEX_FIELD}}

    def container(role: str, argv: Sequence[str], env: list[dict], **more) -> dict:
        return {"name": role, "image": image, "command": [escape_dollars(a) for a in argv],
                "env": env, **more}

    def wait_init(env: list[dict]) -> list[dict]:
        keep = {"DMLC_PS_ROOT_URI", "BYTEPS_TIMEOUT"}
        return [container("wait-for-scheduler", ["python", "-c", WAIT_FOR_SCHEDULER],
                          [dict(e) for e in env if e["name"] in keep])]

    def job(role: str, pods: int, pod_spec: dict, indexed: bool) -> dict:
        jspec: dict = {"backoffLimit": 0, "completions": pods, "parallelism": pods}
        if indexed:
            jspec["completionMode"] = "Indexed"
        pod_spec = {"restartPolicy": "Never", "enableServiceLinks": False,
                    "automountServiceAccountToken": False, **pod_spec}
        jspec["template"] = {"metadata": {"labels": labels(role)}, "spec": pod_spec}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(f"{name}-{role}", role),
                "spec": jspec}

    docs: list[dict] = [{
        "apiVersion": "v1", "kind": "Secret", "metadata": meta(secret_name), "type": "Opaque",
        "immutable": True,
        "data": {SECRET_KEY: base64.b64encode(identity.secret.encode()).decode("ascii")},
    }]
    server_argv = ["python", "-m", "byteps.server"]
    if distributed:
        docs.append({
            "apiVersion": "v1", "kind": "Service", "metadata": meta(service, "scheduler"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {"app.kubernetes.io/instance": name,
                                  "app.kubernetes.io/component": "scheduler"},
                     "ports": [{"name": "scheduler", "port": port, "targetPort": port,
                                "protocol": "TCP"}]},
        })
        env = _env_list(role_env(spec, "scheduler", base=extra),
                        {"BYTEPS_SECRET": secret_ref, "DMLC_PS_ROOT_URI": pod_ip})
        docs.append(job("scheduler", 1, {"containers": [container(
            "scheduler", server_argv, env,
            ports=[{"name": "scheduler", "containerPort": port, "protocol": "TCP"}])]},
            indexed=False))
        env = _env_list({**role_env(spec, "server", node_host=_POD_IP, base=extra),
                         "DMLC_PORT": str(port)},
                        {"BYTEPS_SECRET": secret_ref, "DMLC_NODE_HOST": pod_ip})
        docs.append(job("server", servers, {"initContainers": wait_init(env), "containers": [
            container("server", server_argv, env,
                      ports=[{"name": "server", "containerPort": port, "protocol": "TCP"}])]},
            indexed=True))
    worker_env = role_env(spec, "worker", worker_id=0, local_rank=0, node_host=_POD_IP,
                          base=extra)
    del worker_env["BYTEPS_LOCAL_RANK"]  # bpslaunch sets it for each of its L processes
    env = _env_list(worker_env, {"BYTEPS_SECRET": secret_ref, "DMLC_WORKER_ID": index,
                                 "DMLC_NODE_HOST": pod_ip})
    resources: dict = {}
    quantities = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    if quantities:
        resources = {"requests": dict(quantities), "limits": dict(quantities)}
    if gpus is not None:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = gpus
    worker = container("worker", ["bpslaunch", "--", *command], env,
                       volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}])
    if resources:
        worker["resources"] = resources
    # The L local ranks share memory: a memory-backed /dev/shm instead of the runtime's 64 MiB.
    pod: dict = {"containers": [worker],
                 "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    if distributed:
        pod = {"initContainers": wait_init(env), **pod}
    docs.append(job("worker", workers, pod, indexed=True))
    return docs


def render_yaml(docs: Sequence[dict], header: str = "") -> str:
    """``docs`` as one multi-document YAML text (PyYAML, keys in insertion order).

    Raises:
        LaunchError: PyYAML is not installed (``pip install byteps[engines]`` or ``PyYAML``).
    """
    try:
        import yaml
    except ImportError as exc:
        raise LaunchError("--k8s-manifest needs PyYAML: pip install 'byteps[engines]' "
                          "(or PyYAML)") from exc
    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:  # no &id001 anchors: every object spelled out
            return True

    def text(dumper: yaml.SafeDumper, value: str):  # multi-line strings as literal blocks
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    body = yaml.dump_all(list(docs), Dumper=Dumper, sort_keys=False, default_flow_style=False,
                         width=100)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--k8s-manifest`` options of ``bpslaunch`` (``--workers``, ``--servers``,
    ``--local-size``, ``--port`` and ``--env`` are shared with local mode)."""
    g = p.add_argument_group("Kubernetes manifests (--k8s-manifest; see docs/launching.md)")
    g.add_argument("--k8s-manifest", action="store_true",
                   help="write the Kubernetes objects of a job (Secret, headless Service, "
                   "scheduler/server/worker Jobs) as YAML instead of starting it; needs "
                   "--workers and --image")
    g.add_argument("--name", metavar="NAME",
                   help="--k8s-manifest: object name prefix (default byteps-<job id>)")
    g.add_argument("--namespace", metavar="NS",
                   help="--k8s-manifest: namespace of every object (default: kubectl's)")
    g.add_argument("--image", metavar="IMAGE",
                   help="--k8s-manifest: container image with byteps and COMMAND")
    g.add_argument("--cpu", metavar="Q", help="--k8s-manifest: CPU of each worker pod (e.g. 8)")
    g.add_argument("--memory", metavar="Q",
                   help="--k8s-manifest: memory of each worker pod (e.g. 32Gi)")
    g.add_argument("--gpus", type=int, metavar="G",
                   help="--k8s-manifest: nvidia.com/gpu of each worker pod (usually = L)")
    g.add_argument("-o", "--output", metavar="FILE",
                   help="--k8s-manifest: write to FILE (mode 0600) instead of stdout")


def manifest_main(args: argparse.Namespace, command: Sequence[str]) -> int | None:
    """``bpslaunch``'s ``--k8s-manifest`` branch: None when the option is absent (and no
    Kubernetes-only option was given), else the exit code (0, or 2 after printing
    ``bpslaunch: <message>``)."""
    given = [f"--{dest.replace('_', '-')}" for dest in K8S_ONLY_OPTIONS
             if getattr(args, dest, None) is not None]
    if not args.k8s_manifest:
        if not given:
            return None
        return _error(f"{', '.join(given)} only apply with --k8s-manifest")
    try:
        if args.workers is None:
            raise LaunchError("--k8s-manifest needs --workers N")
        if args.image is None:
            raise LaunchError("--k8s-manifest needs --image IMAGE")
        other = [f"--{dest.replace('_', '-')}" for dest in _OTHER_MODES if getattr(args, dest, None)]
        if args.doctor or other:
            raise LaunchError(f"{', '.join(['--doctor'] * args.doctor + other)}: not with "
                              "--k8s-manifest")
        identity = JobIdentity.fresh()
        docs = build_manifests(
            workers=args.workers, servers=1 if args.servers is None else args.servers,
            local_size=1 if args.local_size is None else args.local_size, image=args.image,
            command=command, name=args.name, namespace=args.namespace,
            port=DEFAULT_PORT if args.port is None else args.port,
            extra_env=parse_env_pairs(args.env, LOCAL_MODE_VARS), cpu=args.cpu,
            memory=args.memory, gpus=args.gpus, identity=identity)
        job = docs[-1]["metadata"]["labels"]["app.kubernetes.io/instance"]
        header = (f"byteps job {job} (job id {identity.job_id}), written by bpslaunch "
                  "--k8s-manifest.\nThe Secret holds the job's secret: keep this file private.\n"
                  "kubectl apply -f FILE; kubectl logs --prefix -f -l "
                  f"app.kubernetes.io/instance={job},app.kubernetes.io/component=worker")
        text = render_yaml(docs, header)
    except LaunchError as exc:
        return _error(str(exc))
    if len(docs) == 2 and args.servers:
        print("bpslaunch: one worker pod: no scheduler or servers (set --env "
              "BYTEPS_FORCE_DISTRIBUTED=1 to have them)", file=sys.stderr)
    if args.output is None or args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    try:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)  # also when FILE existed
            f.write(text)
    except OSError as exc:
        return _error(f"cannot write {args.output}: {exc}")
    print(f"bpslaunch: wrote {len(docs)} Kubernetes objects of job {job} to {args.output}",
          file=sys.stderr)
    return 0


def _error(message: str) -> int:
    print(f"bpslaunch: {message}", file=sys.stderr)
    return 2
