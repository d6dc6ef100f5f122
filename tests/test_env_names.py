"""No variable is ignored in silence: unknown ``BYTEPS_*``/``DMLC_*`` names and upstream
BytePS's variables (``core/cpp/common/upstream_knobs.cc``, rendered into ``docs/env.md``).

* the check itself (``byteps._core.check_environment``): closest-name suggestion, values never
  echoed, every upstream variable reported truthfully; no upstream variable is refused any
  more (``BYTEPS_ENABLE_ASYNC`` is a knob since asynchronous training exists, docs/async.md);
* the table: consistent with the knob registry, every entry rendered into ``docs/env.md``;
* real processes: a worker warns once per process (two ``init()``), a worker with
  ``BYTEPS_ENABLE_ASYNC=1`` and no servers fails ``init()`` with ``ConfigError``, ``bpslaunch``
  warns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jobs import free_port

import byteps.knobs as knobs_mod
from byteps import _core
from byteps.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {k["name"]: k for k in _core.knobs()}
ALIASES = {a for k in KNOBS.values() for a in k["aliases"]}
UPSTREAM = {v["name"]: v for v in _core.upstream_knobs()}
OFF = ["", "0", "false", "FALSE", "no", "off", "Off", "n"]


def clean_env(**overrides):
    """os.environ without any BYTEPS_*/DMLC_* variable, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BYTEPS_", "DMLC_", "PS_"))}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def notices(env):
    return _core.check_environment(env)


# ---------------------------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("typo,meant", [
    ("BYTEPS_PARTITION_BYTE", "BYTEPS_PARTITION_BYTES"),
    ("BYTEPS_PARTITION_BYTESS", "BYTEPS_PARTITION_BYTES"),
    ("BYTEPS_PARTITON_BYTES", "BYTEPS_PARTITION_BYTES"),
    ("BYTEPS_SCHEDULING_CREDITS", "BYTEPS_SCHEDULING_CREDIT"),
    ("BYTEPS_TIMEOUTS", "BYTEPS_TIMEOUT"),
    ("DMLC_NUM_WORKERS", "DMLC_NUM_WORKER"),
    ("DMLC_NUM_SEVRER", "DMLC_NUM_SERVER"),
    ("DMLC_LOCAL_SIZE", "BYTEPS_LOCAL_SIZE"),  # wrong prefix
    ("BYTEPS_NUM_WORKER", "DMLC_NUM_WORKER"),
    ("BYTEPS_LOG_LEVLE", "BYTEPS_LOG_LEVEL"),  # transposition
    ("BYTEPS_ENABLE_ASYNCH", "BYTEPS_ENABLE_ASYNC"),  # an upstream name is known too
])
def test_unknown_name_names_the_closest_known_one(typo, meant):
    [n] = notices({typo: "123"})
    assert n["name"] == typo and n["warning"] is True
    assert n["text"].startswith(f"{typo} is not a byteps variable and is ignored")
    assert f"did you mean {meant}?" in n["text"]
    assert "docs/env.md" in n["text"]


@pytest.mark.parametrize("name", ["BYTEPS_NOT_A_KNOB", "DMLC_FOO", "BYTEPS_X",
                                  "BYTEPS_COMPLETELY_DIFFERENT_THING"])
def test_unknown_name_without_a_plausible_match(name):
    [n] = notices({name: "1"})
    assert n["warning"] and name in n["text"] and "did you mean" not in n["text"]


def test_value_of_an_unknown_variable_is_never_shown():
    [n] = notices({"BYTEPS_SECRETT": "hunter2-very-secret"})
    assert "did you mean BYTEPS_SECRET?" in n["text"]
    assert "hunter2" not in n["text"]


def test_known_and_foreign_names_are_silent():
    env = {name: k["default"] or "1" for name, k in KNOBS.items()}
    env.update({a: "1" for a in ALIASES})
    # not ours, or upstream names too generic to look for
    env.update({"HOME": "/h", "PATH": "/bin", "OMP_NUM_THREADS": "2", "PS1": "$ ",
                "NVIDIA_VISIBLE_DEVICES": "0,1", "UCX_HANDLE_ERRORS": "none", "DEBUG_MODE": "1",
                "PYTHONUNBUFFERED": "1", "byteps_partition_bytes": "1"})
    assert notices(env) == []


def test_one_notice_per_name():
    env = {"BYTEPS_A1": "1", "BYTEPS_B2": "2", "DMLC_C3": "3", "BYTEPS_NCCL_NUM_RINGS": "2",
           "PS_VERBOSE": "2"}
    got = notices(env)
    assert sorted(n["name"] for n in got) == sorted(env)


def test_knob_values_unchanged_by_unknown_names():
    """An unknown name changes no value (and is reported, not silently dropped)."""
    assert _core.knob_values({"BYTEPS_NOT_A_KNOB": "x"}) == _core.knob_values({})
    assert [n["name"] for n in notices({"BYTEPS_NOT_A_KNOB": "x"})] == ["BYTEPS_NOT_A_KNOB"]


@pytest.mark.parametrize("name", [n for n, v in UPSTREAM.items()
                                  if v["checked"] and v["status"] in ("ignored", "replaced")])
def test_each_upstream_variable_reported_with_what_happens_here(name):
    v = UPSTREAM[name]
    value = "some-other-value"
    [n] = notices({name: value})
    assert n["warning"] is True
    assert n["text"].startswith(f"{name}={value} is an upstream BytePS variable")
    assert v["here"] in n["text"]
    if v["status"] == "replaced":
        assert f"replaced by {v['replaced_by']}" in n["text"]
    else:
        assert "not implement" in n["text"] and "ignored" in n["text"]


@pytest.mark.parametrize("name", [n for n, v in UPSTREAM.items()
                                  if v["checked"] and (v["same"] or v["same_off"])])
def test_value_that_changes_nothing_is_info_not_warning(name):
    v = UPSTREAM[name]
    for value in v["same"] + (OFF if v["same_off"] else []):
        [n] = notices({name: value})
        assert n["warning"] is False, (name, value)
        assert "changes nothing here" in n["text"]


@pytest.mark.parametrize("value", ["1", "true", "on", "0", "false"])
def test_async_is_a_knob(value):
    assert notices({"BYTEPS_ENABLE_ASYNC": value}) == []
    assert _core.knob_values({"BYTEPS_ENABLE_ASYNC": value})["BYTEPS_ENABLE_ASYNC"] == value
    with pytest.raises(ConfigError, match="BYTEPS_ASYNC_MAX_STALENESS"):
        _core.knob_values({"BYTEPS_ASYNC_MAX_STALENESS": "-2"})


def test_nothing_is_refused():
    refused = [n for n, v in UPSTREAM.items() if v["status"] == "refused"]
    assert refused == []  # asynchronous training, the last one, is implemented
    assert UPSTREAM["BYTEPS_ENABLE_ASYNC"]["status"] == "implemented"


# ---------------------------------------------------------------------------------------------
# the table and docs/env.md
# ---------------------------------------------------------------------------------------------

def test_upstream_table_consistent_with_registry():
    assert len(UPSTREAM) == len(_core.upstream_knobs()), "an upstream name is listed twice"
    for name, v in UPSTREAM.items():
        assert v["status"] in ("implemented", "replaced", "ignored", "refused"), name
        ours = name.startswith(("BYTEPS_", "DMLC_"))
        if v["status"] == "implemented" and ours:
            assert name in KNOBS, f"{name} is marked implemented but is no knob"
        if v["status"] != "implemented":
            assert name not in KNOBS and name not in ALIASES, f"{name} is a knob"
            assert v["here"].strip(), f"{name}: what happens here instead?"
        if v["status"] == "replaced":
            by = v["replaced_by"]
            assert by, name
            if by.isupper():
                assert by in KNOBS, f"{name} replaced by unknown {by}"
        if ours:
            assert v["checked"], f"{name}: every BYTEPS_*/DMLC_* name is checked"
    # the upstream contract that existing launch scripts rely on is implemented
    for name in ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_WORKER_ID",
                 "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "BYTEPS_LOCAL_RANK",
                 "BYTEPS_LOCAL_SIZE", "BYTEPS_PARTITION_BYTES", "BYTEPS_SCHEDULING_CREDIT",
                 "BYTEPS_SERVER_ENGINE_THREAD", "BYTEPS_LOG_LEVEL"):
        assert UPSTREAM[name]["status"] == "implemented", name


def test_env_md_lists_every_upstream_variable():
    page = (ROOT / "docs" / "env.md").read_text(encoding="utf-8")
    assert page == knobs_mod.render_markdown(), (
        "docs/env.md is stale: run python -m byteps.knobs --write docs/env.md")
    section = page.split("## Upstream BytePS variables", 1)[1]
    for name, v in UPSTREAM.items():
        rows = [line for line in section.splitlines()
                if line.startswith((f"| `{name}` |", f"| [`{name}`]("))]
        assert len(rows) == 1, name
        status = rows[0].split(" | ")[1]
        assert status.replace("*", "").startswith(v["status"]), (name, status)
        assert rows[0].count(" | ") == 3, rows[0]
    assert "did you mean BYTEPS_PARTITION_BYTES?" in section


def test_docs_check_catches_a_stale_upstream_table(tmp_path):
    stale = tmp_path / "env.md"
    page = knobs_mod.render_markdown()
    stale.write_text(page.replace("| `DMLC_NUM_PORTS` | ignored |", "| `DMLC_NUM_PORTS` | implemented |"))
    out = tmp_path / "diff.txt"
    with open(out, "w") as f:
        assert knobs_mod.check(str(stale), out=f) == 1
    assert "DMLC_NUM_PORTS" in out.read_text()
    stale.write_text(page)
    assert knobs_mod.check(str(stale)) == 0


# ---------------------------------------------------------------------------------------------
# real processes
# ---------------------------------------------------------------------------------------------

_TWICE = textwrap.dedent("""
    import byteps.basics as basics
    basics.init(); basics.shutdown()
    basics.init(); basics.shutdown()
    print("done")
""")


def test_worker_warns_once_per_process():
    env = clean_env(BYTEPS_PARTITION_BYTE="65536", BYTEPS_NCCL_NUM_RINGS="2",
                    DMLC_NUM_PORTS="1", BYTEPS_NOT_A_KNOB="hunter2")
    r = subprocess.run([sys.executable, "-c", _TWICE], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    err = r.stderr
    assert err.count("did you mean BYTEPS_PARTITION_BYTES?") == 1, err
    assert err.count("BYTEPS_NCCL_NUM_RINGS=2 is an upstream BytePS variable") == 1, err
    assert err.count("BYTEPS_NOT_A_KNOB is not a byteps variable") == 1, err
    assert "hunter2" not in err
    assert "DMLC_NUM_PORTS" not in err  # INFO, below the default level WARNING
    assert err.count("WARNING") == 3, err


def test_worker_info_line_for_a_harmless_upstream_value():
    env = clean_env(DMLC_NUM_PORTS="1", BYTEPS_LOG_LEVEL="INFO")
    r = subprocess.run([sys.executable, "-c", _TWICE], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "DMLC_NUM_PORTS=1 is an upstream" in ln]
    assert len(lines) == 1 and " INFO" in lines[0], r.stderr


def test_log_level_error_silences_the_warning():
    env = clean_env(BYTEPS_PARTITION_BYTE="65536", BYTEPS_LOG_LEVEL="ERROR")
    r = subprocess.run([sys.executable, "-c", _TWICE], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "BYTEPS_PARTITION_BYTE" not in r.stderr, r.stderr


def test_worker_init_async_needs_servers():
    probe = textwrap.dedent("""
        import json, byteps.basics as basics
        from byteps.errors import ConfigError
        try:
            basics.init()
            print(json.dumps({"raised": None}))
        except ConfigError as err:
            print(json.dumps({"raised": "ConfigError", "message": str(err),
                              "initialized": basics.is_initialized()}))
    """)
    r = subprocess.run([sys.executable, "-c", probe],
                       env=clean_env(BYTEPS_ENABLE_ASYNC="1", DMLC_PS_ROOT_URI="127.0.0.1",
                                     DMLC_PS_ROOT_PORT=free_port()),
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["raised"] == "ConfigError", r.stderr
    assert "DMLC_NUM_SERVER=0" in out["message"]
    assert "BYTEPS_ENABLE_ASYNC=1: the servers keep the parameters" in out["message"]
    assert out["initialized"] is False


def test_scheduler_warns_once():
    env = clean_env(DMLC_ROLE="scheduler", DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1,
                    DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
                    BYTEPS_ALLOW_UNAUTHENTICATED=1, BYTEPS_TIMEOUT=1,
                    DMLC_NUM_WORKERS=2)
    r = subprocess.run([sys.executable, "-m", "byteps.server"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1  # nobody registers: rendezvous timeout after 1 s
    assert r.stderr.count("DMLC_NUM_WORKERS is not a byteps variable") == 1, r.stderr
    assert "did you mean DMLC_NUM_WORKER?" in r.stderr


def test_launcher_warns_and_children_too(tmp_path):
    cmd = [sys.executable, "-c", "import byteps.basics as b; b.init(); b.shutdown()"]
    env = clean_env(BYTEPS_PARTITION_BYTE="65536")
    r = subprocess.run([sys.executable, "-m", "byteps.launch", "--workers", "1",
                        "--local-size", "2", *cmd],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "did you mean BYTEPS_PARTITION_BYTES?" in ln]
    launcher_lines = [ln for ln in lines if ln.startswith("bpslaunch: warning: ")]
    assert len(launcher_lines) == 1, r.stderr
    assert len(lines) == 3, r.stderr  # the launcher, then each of the two workers once
