"""What a user's ``pip install .`` ships: the files of the product wheel (built without the CMake
option ``BYTEPS_BUILD_TESTING``), read from the wheel itself.

The nox unit session builds that wheel beside the test wheel it installs and names it in
``PRODUCT_WHEEL`` (noxfile.py); elsewhere the tests skip, saying so. The wheel holds the package
``byteps`` (with ``byteps/_core*.so``) and its dist-info, nothing else: no test-hook module
``byteps._core_testing``, no C++ sources, no test code, no recorded lab data.
"""

from __future__ import annotations

import os
import re
import zipfile

import pytest

#: A file of the extension module ``byteps._core_testing`` (the C++ core's test hooks).
TESTING_MODULE = re.compile(r"(^|/)_core_testing[.].*(so|pyd)$")
#: Sources that stay in the repository: the C++ core (its test hooks among them) and tests.
SOURCE_SUFFIXES = (".cc", ".cpp", ".h", ".hpp", ".cmake", "CMakeLists.txt")
#: Names that only the test hooks register with pybind11 (core/cpp/python/testing/): none may
#: be in the shipped byteps._core.
HOOK_NAMES = [b"SummationRounds", b"UcxTestPeer", b"UcxVanProbe", b"one_rank_collective",
              b"coll_program", b"van_stream", b"set_job_secret", b"compressor_throughput",
              b"fake_device"]
#: Recorded lab data that must not ship: measurements and the validation against them are the
#: benchmark lab's (benchmarks/), not the simulator's.
LAB_DATA = ["byteps/sim/recorded.py", "byteps/sim/validate.py"]


@pytest.fixture(scope="module")
def wheel():
    path = os.environ.get("PRODUCT_WHEEL")
    if not path:
        pytest.skip("PRODUCT_WHEEL is not set: `python -m nox -s unit` builds the product wheel "
                    "(pip wheel . without BYTEPS_BUILD_TESTING) and names it there")
    with zipfile.ZipFile(path) as z:
        yield z


def test_only_the_package_and_its_dist_info_ship(wheel):
    names = wheel.namelist()
    dist_info = [n for n in names if re.match(r"byteps-[^/]+[.]dist-info/", n)]
    assert dist_info, names
    assert [n for n in names if not n.startswith("byteps/") and n not in dist_info] == []
    cores = [n for n in names if re.fullmatch(r"byteps/_core[.][^/]*so", n)]
    assert len(cores) == 1, names
    assert wheel.getinfo(cores[0]).file_size > 0


def test_no_test_hooks_ship(wheel):
    names = wheel.namelist()
    assert [n for n in names if TESTING_MODULE.search(n)] == []
    assert [n for n in names if n.endswith(SOURCE_SUFFIXES)] == []
    assert [n for n in names if "test" in n.rsplit("/", 1)[-1].lower()] == []
    [core] = [n for n in names if re.fullmatch(r"byteps/_core[.][^/]*so", n)]
    binary = wheel.read(core)
    assert [h.decode() for h in HOOK_NAMES if h in binary] == []


def test_no_recorded_lab_data_ships(wheel):
    assert sorted(set(LAB_DATA) & set(wheel.namelist())) == []
