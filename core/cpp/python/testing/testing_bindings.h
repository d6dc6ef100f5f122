// Pieces of byteps._core_testing: the C++ core's test hooks, a module of its own that only a
// build with -DBYTEPS_BUILD_TESTING=ON makes (the test sessions; never the wheel a user's
// `pip install .` builds). Not a public API. Each Bind* lives in its own file; the error
// helpers are byteps._core's (python/bindings.h), so the hooks raise byteps.errors classes too.
#pragma once
#include <pybind11/pybind11.h>

#include "python/bindings.h"

namespace byteps {
namespace python {

void BindUnits(pybind11::module_& m);  // partitioner, queue, programs, key plan, codec, secret
void BindRounds(pybind11::module_& m);  // SummationRounds: the server's round logic
void BindVan(pybind11::module_& m);  // the van seam on its own: van_*, UcxVanProbe
void BindUcx(pybind11::module_& m);  // UcxTestPeer (UCX builds), ucx_available
void BindCompress(pybind11::module_& m);  // Compressor, spec text, learning rate, throughput
void BindDevice(pybind11::module_& m);  // one_rank_collective, fake_device

}  // namespace python
}  // namespace byteps
