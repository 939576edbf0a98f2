// TMA tensor-map plans and encoding shared by the Hopper forward and backward launchers.
#include "backends/cuda/sm90/tma_map.hpp"

#include <algorithm>
#include <cstring>

#include "flashport/error.hpp"
#include "jit/jit.hpp"

namespace flashport::cuda::hopper {
namespace {

static_assert(sizeof(CUtensorMap) == sizeof(TmaDesc) && alignof(CUtensorMap) <= alignof(TmaDesc),
              "TmaDesc must mirror CUtensorMap");

using EncodeTiled = decltype(&::cuTensorMapEncodeTiled);

/// cuTensorMapEncodeTiled from the driver (the library never links libcuda).
EncodeTiled encode_tiled() {
  const auto fn = reinterpret_cast<EncodeTiled>(jit::tensor_map_encoder());
  if (!fn)
    throw Error("", "cuTensorMapEncodeTiled is not available (libcuda.so.1 missing or older than CUDA 12)");
  return fn;
}

}  // namespace

MapPlan plan_map(const char* name, const Operand& t, long long d, long long heads, long long rows,
                 long long batch, int box_rows, int elem_bytes) {
  MapPlan m{};
  struct Outer {
    long long size, stride;
    int which;  // 0 head, 1 row, 2 batch
  };
  Outer outer[3] = {
      {heads, t.head_stride, 0}, {std::max(rows, 1LL), t.row_stride, 1}, {batch, t.batch_stride, 2}};
  std::stable_sort(outer, outer + 3, [](const Outer& a, const Outer& b) {
    if ((a.size == 1) != (b.size == 1)) return b.size == 1;
    return a.stride < b.stride;
  });
  m.dims[0] = (cuuint64_t)d;
  m.swizzle_bytes = chunk_row_bytes((int)d, elem_bytes);  // the kernels' Q / K chunk rows
  m.box[0] = (cuuint32_t)(m.swizzle_bytes / elem_bytes);
  long long extent = d * elem_bytes;  // bytes spanned by the dimensions placed so far
  for (int i = 0; i < 3; ++i) {
    const Outer& o = outer[i];
    long long stride = o.stride * elem_bytes;
    if (o.size == 1) {
      stride = (extent + 15) / 16 * 16;
    } else if (o.stride <= 0 || stride % 16 != 0) {
      m.error = std::string(name) + " needs positive strides that are multiples of " +
                std::to_string(16 / elem_bytes) + " elements (16 bytes)";
      return m;
    }
    if (stride >= (1LL << 40) || o.size >= (1LL << 31)) {
      m.error = std::string(name) + " is too large for a TMA tensor map";
      return m;
    }
    m.dims[1 + i] = (cuuint64_t)o.size;
    m.strides[i] = (cuuint64_t)stride;
    m.box[1 + i] = o.which == 1 ? (cuuint32_t)box_rows : 1u;
    (o.which == 0 ? m.pos.head : o.which == 1 ? m.pos.row : m.pos.batch) = 1 + i;
    extent = std::max(extent, stride * o.size);
  }
  return m;
}

TmaDesc encode(const char* name, const MapPlan& plan, int elem_type, void* ptr, long long rows) {
  TmaDesc desc{};
  if (rows <= 0) return desc;
  CUtensorMap map;
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = elem_type == kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : elem_type == kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_UINT8;  // fp8: bytes
  const CUresult rc = encode_tiled()(
      &map, type, 4, ptr, plan.dims, plan.strides, plan.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      plan.swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    throw Error(name, "cuTensorMapEncodeTiled failed (CUresult " + std::to_string((int)rc) + ") for dims (" +
                          std::to_string(plan.dims[0]) + ", " + std::to_string(plan.dims[1]) + ", " +
                          std::to_string(plan.dims[2]) + ", " + std::to_string(plan.dims[3]) + ")");
  }
  std::memcpy(&desc, &map, sizeof(desc));
  return desc;
}

}  // namespace flashport::cuda::hopper
