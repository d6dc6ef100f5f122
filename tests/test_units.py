"""Unit tests of the core's configuration and its single-machine path (docs/architecture.md
§3, §10), through ``byteps._core`` and the worker API of a single-machine job (the
scheduling pieces: tests/test_units_scheduling.py; the frame codec: tests/test_units_frame.py):

* knobs: validation errors name the variable and value; ``docs/env.md`` is current;
* worker configuration errors through the real API (each in a fresh process): raised before
  any thread starts, process exits promptly; ``byteps.server`` without a scheduler address;
* single-machine push_pull of every dtype (one process with default env is a 1-worker job).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import byteps
import byteps.basics as basics
from byteps import _core
from byteps.errors import ConfigError, NotInitializedError

ROOT = Path(__file__).resolve().parents[1]
STORAGE = {"bfloat16": np.uint16}  # NumPy has no bfloat16: carry its bits in uint16


def _knobs_module():
    """``byteps.knobs``; loaded from core/knobs.py when the installed package lacks it."""
    try:
        return importlib.import_module("byteps.knobs")
    except ImportError:
        path = ROOT / "core" / "knobs.py"
        spec = importlib.util.spec_from_file_location("byteps_knobs_src", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def _knobs_cli():
    """argv prefix that runs the knobs CLI (``-m byteps.knobs`` when installed)."""
    if importlib.util.find_spec("byteps.knobs") is not None:
        return [sys.executable, "-m", "byteps.knobs"]
    return [sys.executable, str(ROOT / "core" / "knobs.py")]


def clean_env(**overrides):
    """os.environ without any BYTEPS_*/DMLC_* variable, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("BYTEPS_") or k.startswith("DMLC_"))}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


# =============================================================================================
# knobs (docs/architecture.md §10) and docs/env.md
# =============================================================================================

KNOBS = list(_core.knobs())
KNOB_BY_NAME = {k["name"]: k for k in KNOBS}


class TestKnobs:
    def test_defaults(self):
        values = _core.knob_values({})
        assert set(values) == set(KNOB_BY_NAME)
        for name, k in KNOB_BY_NAME.items():
            assert values[name] == k["default"], name
        assert values["DMLC_ROLE"] == "worker"
        assert values["DMLC_NUM_WORKER"] == "1"
        assert values["BYTEPS_PARTITION_BYTES"] == "262144"  # the scheduling sweep
        assert values["BYTEPS_SCHEDULING_CREDIT"] == "4"
        assert values["BYTEPS_TCP_NOTSENT_LOWAT"] == "65536"

    def test_valid_values_pass_through(self):
        env = {"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "8", "BYTEPS_LOG_LEVEL": "debug",
               "BYTEPS_FORCE_DISTRIBUTED": "true", "BYTEPS_TIMEOUT": "2.5",
               "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "1234"}
        values = _core.knob_values(env)
        for name, v in env.items():
            assert values[name] == v

    def test_unknown_variables_change_nothing_but_are_reported(self):
        # values unchanged; the name is reported (tests/test_env_names.py: warnings, refusals)
        assert _core.knob_values({"BYTEPS_NOT_A_KNOB": "x"}) == _core.knob_values({})
        [notice] = _core.check_environment({"BYTEPS_NOT_A_KNOB": "x"})
        assert notice["warning"] and "BYTEPS_NOT_A_KNOB" in notice["text"]

    @pytest.mark.parametrize("name,value", [
        ("DMLC_NUM_WORKER", "abc"),
        ("DMLC_NUM_WORKER", "0"),
        ("DMLC_NUM_WORKER", "2.5"),
        ("DMLC_NUM_WORKER", ""),
        ("DMLC_NUM_WORKER", "99999999999999999999999"),
        ("BYTEPS_PARTITION_BYTES", "-5"),
        ("BYTEPS_PARTITION_BYTES", "4095"),
        ("BYTEPS_PARTITION_BYTES", "4096 "),
        ("DMLC_ROLE", "boss"),
        ("DMLC_ROLE", "Worker"),
        ("BYTEPS_LOG_LEVEL", "loud"),
        ("BYTEPS_FORCE_DISTRIBUTED", "maybe"),
        ("BYTEPS_FORCE_DISTRIBUTED", "2"),
        ("BYTEPS_TIMEOUT", "nan"),
        ("BYTEPS_TIMEOUT", "inf"),
        ("BYTEPS_TIMEOUT", "0"),
        ("BYTEPS_HEARTBEAT_INTERVAL", "fast"),
        ("DMLC_PS_ROOT_PORT", "http"),
        ("DMLC_PS_ROOT_PORT", "70000"),
        ("DMLC_WORKER_ID", "-1"),
        ("BYTEPS_LOCAL_SIZE", "0"),
    ])
    def test_invalid_value_raises_config_error(self, name, value):
        with pytest.raises(ConfigError) as info:
            _core.knob_values({name: value})
        msg = str(info.value)
        assert name in msg
        assert f"'{value}'" in msg or value in msg
        assert "expected" in msg  # says what is accepted
        assert isinstance(info.value, byteps.ConfigError)
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize("k", [k for k in KNOBS if k["type"] == "int" and k["range"]],
                             ids=lambda k: k["name"])
    def test_int_range_boundaries(self, k):
        lo, hi = int(k["range"][0]), int(k["range"][1])
        name = k["name"]
        for ok in (lo, hi):
            assert _core.knob_values({name: str(ok)})[name] == str(ok)
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ConfigError, match=name):
                _core.knob_values({name: str(bad)})

    @pytest.mark.parametrize("k", [k for k in KNOBS if k["type"] == "choice"],
                             ids=lambda k: k["name"])
    def test_every_choice_accepted(self, k):
        for c in k["choices"]:
            assert _core.knob_values({k["name"]: c})[k["name"]] == c

    @pytest.mark.parametrize("v", ["1", "0", "true", "false", "yes", "no", "on", "off", "True"])
    def test_bool_spellings(self, v):
        assert _core.knob_values({"BYTEPS_LOG_HIDE_TIME": v})["BYTEPS_LOG_HIDE_TIME"] == v

    def test_registry_complete(self):
        assert len(KNOB_BY_NAME) == len(KNOBS), "a knob is declared twice"
        for k in KNOBS:
            assert k["name"].startswith(("BYTEPS_", "DMLC_")), k["name"]
            assert k["doc"].strip(), f"{k['name']} has no doc"
            assert k["type"] in ("int", "float", "bool", "string", "choice")
            assert k["used_by"].strip(), k["name"]
            if k["type"] == "choice":
                assert k["choices"] and (k["default"] == "" or k["default"] in k["choices"])
        for name in ["DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_WORKER_ID",
                     "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NODE_HOST", "DMLC_INTERFACE",
                     "BYTEPS_LOCAL_RANK", "BYTEPS_LOCAL_SIZE", "BYTEPS_PARTITION_BYTES",
                     "BYTEPS_SCHEDULING_CREDIT"]:
            assert name in KNOB_BY_NAME  # the upstream contract (docs/architecture.md §10)

    def test_defaults_valid(self):
        """Every non-empty default passes its own validation (knob_values({}) validates them)."""
        _core.knob_values({})
        for k in KNOBS:
            if k["default"] != "":
                _core.knob_values({k["name"]: k["default"]})

    def test_env_md_up_to_date(self):
        knobs_mod = _knobs_module()
        page = (ROOT / "docs" / "env.md").read_text(encoding="utf-8")
        assert page == knobs_mod.render_markdown(), (
            "docs/env.md is stale: run python -m byteps.knobs --write docs/env.md")
        for k in KNOBS:
            assert f"`{k['name']}`" in page

    def test_render_markdown_content(self):
        page = _knobs_module().render_markdown()
        assert page.startswith("# ")
        assert "core/cpp/common/knobs.cc" in page
        assert "ConfigError" in page
        for title in ("Cluster and bootstrap", "Worker core", "Server", "Logging"):
            assert f"## {title}" in page
        # every knob has exactly one table row with six cells
        for k in KNOBS:
            rows = [line for line in page.splitlines() if line.startswith(f"| `{k['name']}` |")]
            assert len(rows) == 1, k["name"]
            assert rows[0].count(" | ") == 5, rows[0]

    def test_cli_check_and_write(self, tmp_path):
        cli = _knobs_cli()
        env = clean_env()
        r = subprocess.run(cli + ["--check", str(ROOT / "docs" / "env.md")], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        out = tmp_path / "env.md"
        r = subprocess.run(cli + ["--write", str(out)], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        assert out.read_text() == (ROOT / "docs" / "env.md").read_text()
        out.write_text(out.read_text().replace("Role of this process.", "Role."))
        r = subprocess.run(cli + ["--check", str(out)], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1
        assert "Role of this process." in r.stdout  # a diff is shown
        r = subprocess.run(cli + ["--markdown"], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and r.stdout == out.read_text().replace(
            "Role.", "Role of this process.")
        r = subprocess.run(cli + ["--check", str(tmp_path / "missing.md")], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1


# =============================================================================================
# worker configuration errors through the real API (each in a fresh process)
# =============================================================================================

_INIT_PROBE = textwrap.dedent("""
    import json, os, sys, threading, time
    def native_threads():
        return len(os.listdir("/proc/self/task"))
    import byteps.basics as basics
    from byteps.errors import ConfigError
    before = native_threads()
    t0 = time.monotonic()
    result = {"raised": None, "message": ""}
    try:
        basics.init()
    except ConfigError as err:
        result["raised"] = "ConfigError"
        result["message"] = str(err)
    except Exception as err:
        result["raised"] = type(err).__name__
        result["message"] = str(err)
    result["init_s"] = time.monotonic() - t0
    result["py_threads"] = threading.active_count()
    result["native_before"] = before
    result["native_after"] = native_threads()
    result["initialized"] = basics.is_initialized()
    print(json.dumps(result))
""")


def _probe_init(**env):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _INIT_PROBE], env=clean_env(**env),
                       capture_output=True, text=True, timeout=30)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), elapsed


@pytest.mark.parametrize("env,variable", [
    ({"DMLC_NUM_WORKER": "2"}, "DMLC_WORKER_ID"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0", "DMLC_PS_ROOT_URI": "127.0.0.1"},
     "DMLC_PS_ROOT_PORT"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0", "DMLC_PS_ROOT_URI": "127.0.0.1",
      "DMLC_PS_ROOT_PORT": "http"}, "DMLC_PS_ROOT_PORT"),
    ({"BYTEPS_LOCAL_RANK": "2", "BYTEPS_LOCAL_SIZE": "2"}, "BYTEPS_LOCAL_RANK"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2", "DMLC_PS_ROOT_URI": "127.0.0.1",
      "DMLC_PS_ROOT_PORT": "1234", "DMLC_NUM_SERVER": "1"}, "DMLC_WORKER_ID"),
    ({"DMLC_NUM_WORKER": "abc"}, "DMLC_NUM_WORKER"),
    ({"BYTEPS_PARTITION_BYTES": "-5"}, "BYTEPS_PARTITION_BYTES"),
    ({"DMLC_ROLE": "server"}, "DMLC_ROLE"),
], ids=["no-worker-id", "no-root-uri", "no-root-port", "bad-root-port", "local-rank-too-big",
        "worker-id-too-big", "bad-num-worker", "negative-partition", "role-server"])
def test_init_config_error_before_any_thread(env, variable):
    result, elapsed = _probe_init(**env)
    assert result["raised"] == "ConfigError", result
    assert variable in result["message"], result["message"]
    assert not result["initialized"]
    assert result["py_threads"] == 1
    assert result["native_after"] == result["native_before"], "a native thread was started"
    assert elapsed < 5.0, f"the failed process took {elapsed:.1f} s to exit"


def test_not_initialized_errors():
    code = textwrap.dedent("""
        import byteps.basics as basics
        from byteps.errors import NotInitializedError
        for fn in (basics.size, basics.rank, basics.local_size, basics.local_rank,
                   lambda: basics.declare("x"),
                   lambda: basics.push_pull_async("x", 0, 0, 0, "float32", [0], False)):
            try:
                fn()
            except NotInitializedError:
                pass
            else:
                raise SystemExit("no NotInitializedError from %r" % fn)
        basics.shutdown()  # safe without init
        basics.init(); assert basics.size() == 1; basics.shutdown()
        try:
            basics.size()
        except NotInitializedError:
            print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "OK"


def test_not_initialized_error_class():
    assert issubclass(NotInitializedError, byteps.BytePSError)


@pytest.mark.parametrize("env,variable", [
    ({"DMLC_ROLE": "server"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_ROLE": "scheduler"}, "DMLC_PS_ROOT_URI"),
    ({"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1"}, "DMLC_PS_ROOT_PORT"),
    ({"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "x"},
     "DMLC_PS_ROOT_PORT"),
    ({"DMLC_ROLE": "worker"}, "DMLC_ROLE"),
])
def test_server_config_errors(env, variable):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "byteps.server"], env=clean_env(**env),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert variable in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 5.0


# =============================================================================================
# single-machine push_pull (one process with default env is a 1-worker job)
# =============================================================================================


@pytest.fixture(scope="module")
def single_worker():
    """init() a 1-worker job in this process with a clean BYTEPS_*/DMLC_* environment."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(("BYTEPS_", "DMLC_"))}
    for k in saved:
        del os.environ[k]
    try:
        basics.init()
        assert basics.size() == 1 and basics.rank() == 0
        assert basics.local_size() == 1 and basics.local_rank() == 0
        yield basics
    finally:
        basics.shutdown()
        os.environ.update(saved)


def _array(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    npdt = STORAGE.get(dtype, dtype)
    if np.issubdtype(np.dtype(npdt), np.integer) and dtype != "bfloat16":
        info = np.iinfo(npdt)
        return rng.integers(info.min, info.max, size=shape, dtype=npdt, endpoint=True)
    if dtype == "bfloat16":
        f = rng.standard_normal(shape).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    return rng.standard_normal(shape).astype(npdt)


def _push_pull(b, name, a, out, average=False):
    """push_pull of ``a`` into ``out``; the dtype name is the tensor name's first field."""
    dtype = name.split(":")[0]
    h = b.push_pull_async(name, a.ctypes.data, out.ctypes.data, a.nbytes, dtype, a.shape, average)
    b.wait(h)


DTYPES = list(basics.SUPPORTED_DTYPES)


class TestSingleMachinePushPull:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("average", [False, True])
    def test_out_of_place_each_dtype(self, single_worker, dtype, average):
        a = _array(dtype, (33, 17), seed=1)
        keep = a.copy()
        out = np.zeros_like(a)
        _push_pull(single_worker, f"{dtype}:oop:{average}", a, out, average)
        assert out.tobytes() == keep.tobytes()  # sum (or average) over one worker
        assert a.tobytes() == keep.tobytes()  # the input is untouched

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_in_place_each_dtype(self, single_worker, dtype):
        a = _array(dtype, (1000,), seed=2)
        keep = a.copy()
        _push_pull(single_worker, f"{dtype}:inplace", a, a)
        assert a.tobytes() == keep.tobytes()

    def test_multi_partition_tensor(self, single_worker):
        a = _array("float32", (3 * 4096000 // 4 + 123,), seed=3)  # 4 partitions, short tail
        out = np.zeros_like(a)
        _push_pull(single_worker, "float32:multi", a, out)
        assert np.array_equal(out, a)
        for _ in range(3):  # the same name again: later rounds work too
            out[:] = 0
            _push_pull(single_worker, "float32:multi", a, out)
            assert np.array_equal(out, a)

    @pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2)])
    def test_size_zero(self, single_worker, shape):
        a = np.zeros(shape, np.float32)
        h = single_worker.push_pull_async(f"zero{shape}", a.ctypes.data, a.ctypes.data, 0,
                                          "float32", a.shape, False)
        single_worker.wait(h)

    def test_scalar(self, single_worker):
        a = np.array(3.5, np.float64)
        out = np.zeros_like(a)
        _push_pull(single_worker, "float64:scalar", a, out)
        assert out == 3.5

    def test_many_in_flight_at_once(self, single_worker):
        arrays = [_array("float32", (1000 + i,), seed=i) for i in range(50)]
        outs = [np.zeros_like(a) for a in arrays]
        handles = [single_worker.push_pull_async(f"many.{i}", a.ctypes.data, o.ctypes.data,
                                                 a.nbytes, "float32", a.shape, False)
                   for i, (a, o) in enumerate(zip(arrays, outs))]
        for h in handles:
            single_worker.wait(h)
        for a, o in zip(arrays, outs):
            assert np.array_equal(a, o)

    def test_duplicate_name_in_flight(self, single_worker):
        a = np.ones(64 << 20 >> 2, np.float32)  # 64 MiB, 16 partitions to copy out
        out = np.zeros_like(a)
        b = single_worker
        h1 = b.push_pull_async("dup", a.ctypes.data, out.ctypes.data, a.nbytes, "float32",
                               a.shape, False)
        try:
            h2 = b.push_pull_async("dup", a.ctypes.data, out.ctypes.data, a.nbytes, "float32",
                                   a.shape, False)
        except ValueError as err:
            assert "dup" in str(err) and "in flight" in str(err)
            b.wait(h1)
            assert np.array_equal(out, a)
        else:  # the first one finished before the second call: nothing to check
            b.wait(h1)
            b.wait(h2)
            pytest.skip("the first push_pull finished before the second started")
        # after the wait, the name is free again
        b.wait(b.push_pull_async("dup", a.ctypes.data, out.ctypes.data, a.nbytes, "float32",
                                 a.shape, False))

    @pytest.mark.parametrize("nbytes,shape", [(12, (4,)), (20, (4,)), (0, (1,)), (16, (2, 3))])
    def test_wrong_nbytes_for_shape(self, single_worker, nbytes, shape):
        buf = np.zeros(64, np.float32)
        with pytest.raises(ValueError, match="do not match"):
            single_worker.push_pull_async(f"bad{nbytes}{shape}", buf.ctypes.data,
                                          buf.ctypes.data, nbytes, "float32", shape, False)

    def test_negative_dimension(self, single_worker):
        buf = np.zeros(4, np.float32)
        with pytest.raises(ValueError):
            single_worker.push_pull_async("neg", buf.ctypes.data, buf.ctypes.data, 16,
                                          "float32", (-1, -4), False)

    def test_shape_change_for_a_name(self, single_worker):
        a = np.zeros(8, np.float32)
        _push_pull(single_worker, "float32:reshape", a, a)
        b = a.reshape(2, 4)
        with pytest.raises(ValueError):
            single_worker.push_pull_async("float32:reshape", b.ctypes.data, b.ctypes.data,
                                          b.nbytes, "float32", b.shape, False)

    @pytest.mark.parametrize("dtype", ["complex64", "float128", "bool", "int16", "", "Float32"])
    def test_unsupported_dtype(self, single_worker, dtype):
        buf = np.zeros(4, np.float32)
        with pytest.raises(TypeError, match="unsupported dtype"):
            single_worker.push_pull_async("t", buf.ctypes.data, buf.ctypes.data, 16, dtype,
                                          (4,), False)
        with pytest.raises(TypeError):  # the core checks too, not only the Python wrapper
            _core.push_pull_async("t", buf.ctypes.data, buf.ctypes.data, 16, dtype, [4], False)

    def test_empty_name(self, single_worker):
        buf = np.zeros(4, np.float32)
        with pytest.raises(ValueError):
            single_worker.push_pull_async("", buf.ctypes.data, buf.ctypes.data, 16, "float32",
                                          (4,), False)

    def test_declare(self, single_worker):
        k1 = single_worker.declare("declare.a")
        k2 = single_worker.declare("declare.b")
        assert k2 == k1 + 1
        assert single_worker.declare("declare.a") == k1


# ---------------------------------------------------------------------------- capabilities


def test_build_queries_answer_for_this_process():
    """Horovod's build queries: no MPI, Gloo, oneCCL, DDL or ROCm; CUDA and NCCL as this
    process can use them (byteps.cuda)."""
    from byteps import capabilities, cuda

    for name in ("mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built",
                 "gloo_enabled", "ccl_built", "ddl_built", "rocm_built"):
        assert getattr(capabilities, name)() is False, name
    assert capabilities.cuda_built() == cuda.cuda_available()
    status = cuda.nccl_status()
    want = int(status["version"] or 0) if status.get("stages_supported") else 0
    assert capabilities.nccl_built() == want
    assert set(capabilities.__all__) == {n for n in dir(capabilities) if n.endswith(
        ("_built", "_enabled", "_supported"))}
