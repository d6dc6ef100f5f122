"""What a kubelet would run for each pod of the objects ``bpslaunch --k8s-manifest`` writes.

Used by tests/test_launch_k8s_manifest.py (dicts, no cluster) and tests/test_launch_k8s.py
(the pods' commands run on network-namespace hosts). Only the parts of the Pod API the manifests
use are understood; anything else fails loudly (``K8sEmulationError``), so a manifest cannot
use a feature the tests do not check.

Rules followed (Kubernetes 1.30 documentation, "Define Dependent Environment Variables",
"Indexed Job", "Expose Pod Information to Containers Through Environment Variables"):

* a container's environment is the image's, then ``KUBERNETES_SERVICE_HOST``/``_PORT`` (always
  injected; the manifests turn the other service links off), then its ``env`` list in order,
  each ``value`` expanded: ``$(NAME)`` of a variable defined earlier in the list is replaced,
  ``$$`` becomes ``$``, any other ``$(...)`` stays as it is;
* ``valueFrom.secretKeyRef`` reads the base64 ``data`` of a Secret of the same namespace;
  ``valueFrom.fieldRef`` resolves ``status.podIP``, ``metadata.name``, ``metadata.namespace``
  and the ``batch.kubernetes.io/job-completion-index`` annotation of an Indexed Job's pod;
* an Indexed Job's pod also gets ``JOB_COMPLETION_INDEX``; its hostname is ``<job>-<index>``;
* ``command`` (+ ``args``) is expanded like a value, against the container's environment.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
KUBERNETES_SERVICE = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


class K8sEmulationError(AssertionError):
    """The manifest uses something a kubelet would reject, or that this emulation lacks."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of ``text`` against ``env`` (see module docstring)."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass
class Container:
    """One container of a pod, as the kubelet would start it."""

    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class Pod:
    """One pod of a Job: ``role`` is the Job's ``app.kubernetes.io/component`` label,
    ``index`` its completion index (None outside an Indexed Job)."""

    role: str
    index: int | None
    hostname: str
    ip: str
    init: list[Container] = field(default_factory=list)
    main: list[Container] = field(default_factory=list)


def _field(path: str, *, name: str, namespace: str, ip: str, index: int | None) -> str:
    if path == "status.podIP":
        return ip
    if path == "metadata.name":
        return name
    if path == "metadata.namespace":
        return namespace
    if path == f"metadata.annotations['{INDEX_ANNOTATION}']":
        if index is None:
            raise K8sEmulationError(f"{path}: the pod is not part of an Indexed Job")
        return str(index)
    raise K8sEmulationError(f"fieldRef {path!r} is not emulated")


def _container(spec: dict, *, secrets: Mapping[str, dict], base: Mapping[str, str],
               namespace: str, pod_name: str, ip: str, index: int | None) -> Container:
    allowed = {"name", "image", "command", "args", "env", "ports", "resources", "volumeMounts"}
    unknown = set(spec) - allowed
    if unknown:
        raise K8sEmulationError(f"container fields {sorted(unknown)} are not emulated")
    env = dict(base)
    env.update(KUBERNETES_SERVICE)
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    for entry in spec.get("env", []):
        key = entry["name"]
        if "value" in entry:
            env[key] = expand(entry["value"], env)
            continue
        ref = entry["valueFrom"]
        if "secretKeyRef" in ref:
            secret = secrets.get(ref["secretKeyRef"]["name"])
            if secret is None or ref["secretKeyRef"]["key"] not in secret.get("data", {}):
                raise K8sEmulationError(f"{key}: no Secret key {ref['secretKeyRef']} in "
                                        f"namespace {namespace} (CreateContainerConfigError)")
            env[key] = base64.b64decode(secret["data"][ref["secretKeyRef"]["key"]]).decode()
        elif "fieldRef" in ref:
            env[key] = _field(ref["fieldRef"]["fieldPath"], name=pod_name, namespace=namespace,
                              ip=ip, index=index)
        else:
            raise K8sEmulationError(f"{key}: valueFrom {sorted(ref)} is not emulated")
    if not spec.get("command"):
        raise K8sEmulationError(f"container {spec['name']}: no command (the image's "
                                "entrypoint is unknown here)")
    argv = [expand(a, env) for a in list(spec["command"]) + list(spec.get("args", []))]
    return Container(spec["name"], argv, env)


def pods_of(
    docs: Sequence[dict],
    pod_ip: Callable[[str, int], str],
    base_env: Mapping[str, str],
    default_namespace: str = "default",
) -> list[Pod]:
    """Every pod the Jobs in ``docs`` would create, in document order (pods by index).

    Args:
        docs: the objects (dicts from the YAML).
        pod_ip: ``(role, index or 0) -> the pod's address``.
        base_env: the image's environment (``PATH`` ...).
        default_namespace: the namespace of objects without ``metadata.namespace``.

    Raises:
        K8sEmulationError: a Job or pod uses something this emulation does not know, or a
            reference does not resolve.
    """
    secrets = {}
    for d in docs:
        if d["kind"] == "Secret":
            secrets[(d["metadata"].get("namespace", default_namespace), d["metadata"]["name"])] = d
    pods: list[Pod] = []
    for d in docs:
        if d["kind"] != "Job":
            continue
        ns = d["metadata"].get("namespace", default_namespace)
        job, spec = d["metadata"]["name"], d["spec"]
        template = spec["template"]
        role = template["metadata"]["labels"]["app.kubernetes.io/component"]
        indexed = spec.get("completionMode", "NonIndexed") == "Indexed"
        if spec.get("parallelism", 1) != spec.get("completions", 1):
            raise K8sEmulationError(f"{job}: parallelism != completions (pods would queue)")
        pod_spec = template["spec"]
        if pod_spec.get("restartPolicy") != "Never":
            raise K8sEmulationError(f"{job}: restartPolicy {pod_spec.get('restartPolicy')}")
        ns_secrets = {name: s for (sns, name), s in secrets.items() if sns == ns}
        for i in range(spec.get("completions", 1)):
            index = i if indexed else None
            hostname = f"{job}-{i}" if indexed else f"{job}-emu{i}"
            ip = pod_ip(role, i)

            where = {"secrets": ns_secrets, "base": base_env, "namespace": ns,
                     "pod_name": hostname, "ip": ip, "index": index}
            pods.append(Pod(role, index, hostname, ip,
                            [_container(c, **where) for c in pod_spec.get("initContainers", [])],
                            [_container(c, **where) for c in pod_spec["containers"]]))
    return pods
