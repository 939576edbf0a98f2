// A stand-in for libamdhip64 that the HIP backend opens in the tests (FLASHPORT_HIP_RUNTIME): two
// devices (0: gfx942 with an MI300X's 304 CUs, 1: gfx1100, an RDNA part the backend must refuse), code
// objects checked as a GPU loader would (an AMDGPU ELF for the current device's architecture, with the
// requested kernel and its kernel descriptor), and launches run on the CPU wave64 model after checking
// the grid, block and LDS against what the kernel was built for. "Device" memory is host memory;
// hipMallocAsync fills it with NaN bytes and records it, so a workspace a launch reads must lie inside
// an allocation and be written before it is read.
#define __HIP_PLATFORM_AMD__ 1
#include <elf.h>
#include <hip/hip_runtime_api.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "hip/hip_model_backward.hpp"
#include "hip/hip_model_forward.hpp"
#include "hip/index_check.hpp"
#include "hip/kvcache_append.hpp"
#include "hip/merge_states.hpp"

namespace {

using namespace flashport;

constexpr int kDevices = 2;
const char* const kArchNames[kDevices] = {"gfx942:sramecc+:xnack-", "gfx1100"};
constexpr int kCuCounts[kDevices] = {304, 48};
constexpr unsigned kMachGfx942 = 0x04c;  // EF_AMDGPU_MACH_AMDGCN_GFX942

thread_local int t_device = 0;
std::mutex g_mu;
std::map<std::string, int> g_launches;                       // entry -> launches that ran
std::map<std::string, std::array<unsigned, 3>> g_last_grid;  // entry -> grid of its last launch
std::string g_last_error;
std::map<const char*, size_t> g_allocations;  // hipMallocAsync's live blocks: start -> bytes

struct Module {
  const unsigned char* image;
  unsigned mach;
};
struct Function {
  std::string name;
  unsigned lds;  // the kernel descriptor's group_segment_fixed_size
  bool fp8;      // the code object is an fp8 forward (attn_fwd.hip's attn_fwd_fp8_inputs symbol)
};

hipError_t fail(hipError_t e, const std::string& why) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_last_error = why;
  return e;
}

/// The bytes of symbol `name` in an ELF64 image, or null.
const unsigned char* find_symbol(const unsigned char* image, const std::string& name) {
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(image);
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(image + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(image + sh[i].sh_offset);
    const char* strtab = reinterpret_cast<const char*>(image + sh[sh[i].sh_link].sh_offset);
    for (size_t s = 0; s < sh[i].sh_size / sizeof(Elf64_Sym); ++s) {
      if (name != strtab + syms[s].st_name || syms[s].st_shndx == SHN_UNDEF) continue;
      const Elf64_Shdr& home = sh[syms[s].st_shndx];
      return image + home.sh_offset + (syms[s].st_value - home.sh_addr);
    }
  }
  return nullptr;
}

/// Whether [ptr, ptr + bytes) lies inside one live hipMallocAsync block.
bool allocated(const void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const char* p = static_cast<const char*>(ptr);
  auto it = g_allocations.upper_bound(p);
  if (!p || it == g_allocations.begin()) return false;
  --it;
  return p + bytes <= it->first + it->second;
}

/// Why split-KV arguments are wrong for `entry` (attn_fwd_split, split_combine), or "": dense queries,
/// 2 .. min(128, key tiles) splits, workspaces inside allocations of the size FwdParams states.
std::string split_fault(const amd::FwdParams& prm, const std::string& entry) {
  const AttnProblem& p = prm.p;
  const amd::FwdTile tile = amd::fwd_tile(amd::fwd_head_dim_bucket(p.d, p.dv));
  const long long key_tiles = (p.sk + tile.block_n - 1) / tile.block_n;
  if (prm.num_splits < 2 || prm.num_splits > 128 || prm.num_splits > key_tiles)
    return entry + " with " + std::to_string(prm.num_splits) + " splits over " + std::to_string(key_tiles) +
           " key tiles";
  if (p.cu_seqlens_q) return entry + " of varlen queries";
  const size_t rows = (size_t)(prm.num_splits * amd::fwd_split_rows(p));
  if (!allocated(prm.o_partial, rows * p.dv * sizeof(float)) ||
      !allocated(prm.lse_partial, rows * sizeof(float)))
    return entry + ": a workspace outside the stream-ordered allocations";
  return "";
}

/// One of the backward's three kernels on the model (the buckets the model harness instantiates).
template <class Elem, int kBucket>
void run_backward_entry(const std::string& entry, const amd::BwdParams& prm, wave::model::Dim3 grid) {
  using K = amd::bwd::Kernel<Elem, kBucket>;
  using R = amd::bwd::RowKernel<Elem>;
  if (entry == "attn_bwd")
    wave::model::launch(grid, K::kThreads, K::kLdsBytes, [&](unsigned char* lds) { K::run(prm, lds); });
  else if (entry == "attn_bwd_dot_do_o")
    wave::model::launch(grid, R::kThreads, 0, [&](unsigned char*) { R::dot_do_o(prm); });
  else
    wave::model::launch(grid, R::kThreads, 0, [&](unsigned char*) { R::convert_dq(prm); });
}
template <class Elem>
bool run_backward(const std::string& entry, const amd::BwdParams& prm, int bucket, wave::model::Dim3 grid) {
  switch (bucket) {
    case 64:
      return run_backward_entry<Elem, 64>(entry, prm, grid), true;
    case 128:
      return run_backward_entry<Elem, 128>(entry, prm, grid), true;
    case 256:
      return run_backward_entry<Elem, 256>(entry, prm, grid), true;
    default:
      return false;
  }
}

}  // namespace

extern "C" {

/// Test hook: how many launches of `entry` ran on the model.
int fake_hip_launches(const char* entry) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_launches[entry];
}

/// Test hook: grid dimension `dim` (0..2) of the last launch of `entry` that ran (0 before any).
unsigned fake_hip_last_grid(const char* entry, int dim) {
  std::lock_guard<std::mutex> lock(g_mu);
  const auto it = g_last_grid.find(entry);
  return it == g_last_grid.end() ? 0u : it->second[dim];
}

hipError_t hipGetDeviceCount(int* count) {
  *count = kDevices;
  return hipSuccess;
}
hipError_t hipGetDevice(int* device) {
  *device = t_device;
  return hipSuccess;
}
hipError_t hipSetDevice(int device) {
  if (device < 0 || device >= kDevices) return fail(hipErrorInvalidDevice, "hipSetDevice");
  t_device = device;
  return hipSuccess;
}
hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device) {
  if (device < 0 || device >= kDevices) return fail(hipErrorInvalidDevice, "hipGetDeviceProperties");
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->gcnArchName, kArchNames[device], sizeof prop->gcnArchName - 1);
  prop->multiProcessorCount = kCuCounts[device];
  return hipSuccess;
}
const char* hipGetErrorString(hipError_t e) {
  static thread_local std::string text;
  std::lock_guard<std::mutex> lock(g_mu);
  text = "fake HIP error " + std::to_string((int)e) + ": " + g_last_error;
  return text.c_str();
}

hipError_t hipMallocAsync(void** ptr, size_t bytes, hipStream_t) {
  *ptr = std::malloc(bytes);
  if (!*ptr) return fail(hipErrorOutOfMemory, "hipMallocAsync");
  std::memset(*ptr, 0xff, bytes);  // NaN as floats
  std::lock_guard<std::mutex> lock(g_mu);
  g_allocations[static_cast<const char*>(*ptr)] = bytes;
  return hipSuccess;
}
hipError_t hipFreeAsync(void* ptr, hipStream_t) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_allocations.erase(static_cast<const char*>(ptr)) != 1)
      return fail(hipErrorInvalidValue, "hipFreeAsync");
  }
  std::free(ptr);
  return hipSuccess;
}

/// Mapped host memory is host memory: the device address is the host one.
hipError_t hipHostMalloc(void** ptr, size_t bytes, unsigned int flags) {
  if (!(flags & hipHostMallocMapped))
    return fail(hipErrorInvalidValue, "hipHostMalloc without hipHostMallocMapped");
  *ptr = std::malloc(bytes);
  if (!*ptr) return fail(hipErrorOutOfMemory, "hipHostMalloc");
  std::memset(*ptr, 0xff, bytes);  // the backend must clear it
  return hipSuccess;
}
hipError_t hipHostGetDevicePointer(void** device, void* host, unsigned int) {
  *device = host;
  return hipSuccess;
}
/// Launches run to completion on the model, so nothing is ever pending.
hipError_t hipDeviceSynchronize() {
  return hipSuccess;
}

hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
  const auto* bytes = static_cast<const unsigned char*>(image);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_machine != EM_AMDGPU)
    return fail(hipErrorInvalidImage, "not an AMDGPU ELF");
  const unsigned mach = eh->e_flags & 0xff;
  if (t_device != 0 || mach != kMachGfx942)
    return fail(hipErrorNoBinaryForGpu, "code object for mach " + std::to_string(mach) + " on device " +
                                            std::to_string(t_device) + " (" + kArchNames[t_device] + ")");
  *module = reinterpret_cast<hipModule_t>(new Module{bytes, mach});
  return hipSuccess;
}

hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* name) {
  const Module* m = reinterpret_cast<const Module*>(module);
  if (!find_symbol(m->image, name)) return fail(hipErrorNotFound, std::string("no kernel ") + name);
  const unsigned char* kd = find_symbol(m->image, std::string(name) + ".kd");
  if (!kd) return fail(hipErrorNotFound, std::string("no kernel descriptor ") + name + ".kd");
  unsigned lds = 0;
  std::memcpy(&lds, kd, sizeof lds);  // kernel descriptor byte 0: GROUP_SEGMENT_FIXED_SIZE
  const bool fp8 = find_symbol(m->image, "attn_fwd_fp8_inputs") != nullptr;
  *function = reinterpret_cast<hipFunction_t>(new Function{name, lds, fp8});
  return hipSuccess;
}

hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared, hipStream_t, void** params,
                                 void** extra) {
  const Function* fn = reinterpret_cast<const Function*>(f);
  if (!params || extra || by != 1 || bz != 1 || shared != 0)
    return fail(hipErrorInvalidValue, "launch: one kernel parameter, 1-D blocks, static LDS expected");
  if (fn->name == "attn_fwd" || fn->name == "attn_fwd_split") {
    const amd::FwdParams& prm = *static_cast<const amd::FwdParams*>(params[0]);
    const AttnProblem& p = prm.p;
    const int bucket = amd::fwd_head_dim_bucket(p.d, p.dv);
    const amd::FwdTile tile = amd::fwd_tile(bucket);
    if ((int)fn->lds != amd::fwd_lds_bytes(bucket))
      return fail(hipErrorInvalidValue, fn->name + " built for " + std::to_string(fn->lds) +
                                            " LDS bytes, the problem's " + "bucket d" +
                                            std::to_string(bucket) + " needs " +
                                            std::to_string(amd::fwd_lds_bytes(bucket)));
    // The grid a GPU would run: one block per block_m packed rows (the queries of every head in a kv
    // head's group when the kernel packs GQA, FwdParams::pack_gqa), so it must agree with pack_gqa; grid
    // z is the batch, times the splits for attn_fwd_split.
    const long long group = prm.pack_gqa;
    if (group < 1 || (group > 1 && group != p.hq / p.hk))
      return fail(hipErrorInvalidValue, fn->name + " pack_gqa " + std::to_string(group) + " for " +
                                            std::to_string(p.hq) + "/" + std::to_string(p.hk) + " heads");
    const bool split = fn->name == "attn_fwd_split";
    if (!split && prm.num_splits != 1)
      return fail(hipErrorInvalidValue, "attn_fwd with num_splits " + std::to_string(prm.num_splits));
    if (const std::string why = split ? split_fault(prm, fn->name) : ""; !why.empty())
      return fail(hipErrorInvalidValue, why);
    if (bx != (unsigned)tile.waves * 64 ||
        gx != (unsigned)((p.sq * group + tile.block_m - 1) / tile.block_m) ||
        gy != (unsigned)(group > 1 ? p.hk : p.hq) || gz != (unsigned)(p.batch * prm.num_splits))
      return fail(hipErrorInvalidConfiguration, fn->name + " grid/block do not match the problem");
    if (fn->fp8 != is_fp8_elem(p.in_type))
      return fail(hipErrorInvalidImage, fn->name + " of a " + (fn->fp8 ? "" : "non-") +
                                            "fp8 code object launched for in_type " +
                                            std::to_string(p.in_type));
    test::hipmodel::launch_forward(prm, bucket);
  } else if (fn->name == "split_combine") {
    const amd::FwdParams& prm = *static_cast<const amd::FwdParams*>(params[0]);
    const AttnProblem& p = prm.p;
    if (const std::string why = split_fault(prm, fn->name); !why.empty())
      return fail(hipErrorInvalidValue, why);
    if (bx != (unsigned)amd::kCombineThreads || fn->lds != 0 ||
        gx != (unsigned)((p.sq + amd::kCombineWaves - 1) / amd::kCombineWaves) || gy != (unsigned)p.hq ||
        gz != (unsigned)p.batch)
      return fail(hipErrorInvalidConfiguration, "split_combine grid/block do not match the problem");
    test::hipmodel::launch_combine(prm);
  } else if (fn->name == "kv_append" || fn->name == "rotate_q") {
    const amd::KvAppendParams& prm = *static_cast<const amd::KvAppendParams*>(params[0]);
    const AttnProblem& a = prm.attn;
    const long long rows = fn->name == "kv_append" ? a.batch * prm.s_new * a.hk : a.batch * a.sq * a.hq;
    if (bx != (unsigned)amd::kKvThreads || gx != (unsigned)((rows + amd::kKvWaves - 1) / amd::kKvWaves) ||
        gy != 1 || gz != 1 || fn->lds != 0)
      return fail(hipErrorInvalidConfiguration, fn->name + " block/grid");
    if (fn->name == "rotate_q" && (!prm.q_rot || prm.rotary_dim == 0))
      return fail(hipErrorInvalidValue, "rotate_q without a scratch or a rotary table");
    if (fn->name == "kv_append")
      wave::model::launch({gx, 1, 1}, amd::kKvThreads, 0, [&](unsigned char*) { amd::kv::append(prm); });
    else
      wave::model::launch({gx, 1, 1}, amd::kKvThreads, 0, [&](unsigned char*) { amd::kv::rotate_q(prm); });
  } else if (fn->name == "index_check") {
    const amd::IndexCheckParams& prm = *static_cast<const amd::IndexCheckParams*>(params[0]);
    if (bx != (unsigned)amd::kIndexThreads ||
        gx != (unsigned)((prm.p.batch + amd::kIndexWaves - 1) / amd::kIndexWaves) || gy == 0 || gz != 1 ||
        fn->lds != 0)
      return fail(hipErrorInvalidConfiguration, "index_check block/grid");
    wave::model::launch({gx, gy, 1}, amd::kIndexThreads, 0, [&](unsigned char*) { amd::index::run(prm); });
  } else if (fn->name == "merge_states") {
    const amd::MergeParams& prm = *static_cast<const amd::MergeParams*>(params[0]);
    const long long rows = prm.batch * prm.heads * prm.seqlen;
    if (bx != (unsigned)amd::kMergeThreads ||
        gx != (unsigned)((rows + amd::kMergeWaves - 1) / amd::kMergeWaves) || gy != 1 || gz != 1 ||
        fn->lds != 0)
      return fail(hipErrorInvalidConfiguration, "merge_states block/grid");
    wave::model::launch({gx, 1, 1}, amd::kMergeThreads, 0, [&](unsigned char*) { amd::merge::run(prm); });
  } else if (fn->name.rfind("attn_bwd", 0) == 0) {
    const amd::BwdParams& prm = *static_cast<const amd::BwdParams*>(params[0]);
    const AttnProblem& p = prm.p;
    const int bucket = amd::bwd_head_dim_bucket(p.d, p.dv);
    const bool main_kernel = fn->name == "attn_bwd";
    const unsigned lds = main_kernel ? (unsigned)amd::bwd_lds_bytes(bucket) : 0u;
    const unsigned block =
        main_kernel ? (unsigned)amd::bwd_tile(bucket).waves * 64 : (unsigned)amd::kBwdRowThreads;
    const unsigned grid_x = main_kernel
                                ? (unsigned)(p.deterministic ? prm.num_slices : amd::bwd_key_tiles(p, bucket))
                                : (unsigned)((p.sq + amd::kBwdRowsPerBlock - 1) / amd::kBwdRowsPerBlock);
    if (fn->lds != lds) return fail(hipErrorInvalidValue, fn->name + ": LDS of another bucket");
    if (bx != block || gx != grid_x || gy != (unsigned)(main_kernel ? p.hk : p.hq) || gz != (unsigned)p.batch)
      return fail(hipErrorInvalidConfiguration, fn->name + " grid/block do not match the problem");
    const bool ran = p.in_type == kBF16 ? run_backward<wave::bf16>(fn->name, prm, bucket, {gx, gy, gz})
                                        : run_backward<wave::f16>(fn->name, prm, bucket, {gx, gy, gz});
    if (!ran) return fail(hipErrorNotSupported, "the fake has backward buckets 64, 128 and 256 only");
  } else {
    return fail(hipErrorNotFound, "the fake does not run " + fn->name);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_launches[fn->name];
  g_last_grid[fn->name] = {gx, gy, gz};
  return hipSuccess;
}

}  // extern "C"
