// The Python extension mlakit._mlakit: the C++ API over DLPack arrays (NumPy, PyTorch, CuPy
// through nanobind's ndarray). The `*_reference` functions run the float64 CPU reference on
// host arrays; the others run the GPU kernels on device arrays, asynchronously on the stream
// passed as an integer. The Python package (python/mlakit) chooses between them and
// allocates outputs and workspaces with the caller's framework.
#include "bindings.h"

NB_MODULE(_mlakit, m) {
  m.doc() = "mlakit: MLA and GQA attention kernels (C++/CUDA) over DLPack arrays";
  mlakit::python::bind_decode(m);
  mlakit::python::bind_sparse_decode(m);
  mlakit::python::bind_sparse_prefill(m);
  mlakit::python::bind_fp8_cache(m);
  mlakit::python::bind_gqa_decode(m);
  mlakit::python::bind_mha_prefill(m);
  mlakit::python::bind_merge(m);
}
