// The driver's cuTensorMapEncodeTiled for CuTe's TMA descriptors, looked up once per process.
// CUTLASS by default resolves the entry point through the runtime on every descriptor (four or more
// per launch); build_support.NVCC_FLAGS sets CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL, so CuTe calls
// this symbol instead. Defined here rather than taken from libcuda, which a machine without a driver
// (CI) lacks, and hidden, so it binds only this library's calls.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>

extern "C" __attribute__((visibility("hidden"))) CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address, cuuint64_t const* dims,
    cuuint64_t const* strides, cuuint32_t const* box, cuuint32_t const* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
    CUtensorMapFloatOOBfill oob_fill) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  static std::atomic<Encode> cached{nullptr};  // a failed lookup is not cached: the next call retries
  Encode encode = cached.load(std::memory_order_acquire);
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess || fn == nullptr) {
      return CUDA_ERROR_NOT_FOUND;
    }
    encode = reinterpret_cast<Encode>(fn);
    cached.store(encode, std::memory_order_release);
  }
  return encode(map, type, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2_promotion,
                oob_fill);
}
