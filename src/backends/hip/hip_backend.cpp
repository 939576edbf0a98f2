// The HIP backend (AMD CDNA GPUs): what it takes, which embedded code object serves a call, and the
// launches, with the grids and parameters the CPU-model tests use (tests/hip/hip_model_forward.hpp,
// test_hip_kvcache.cpp). Registered in src/backends/registry.cpp when built with FLASHPORT_HIP=ON.
#include "backends/hip/hip_backend.hpp"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "backends/hip/arch.hpp"
#include "backends/hip/hip_runtime.hpp"
#include "backends/hip/index_check.hpp"
#include "flashport/tensor.hpp"
#include "hip/attn_bwd_config.hpp"
#include "hip/attn_fwd_config.hpp"
#include "hip/kvcache_append_config.hpp"
#include "hip/merge_states_config.hpp"

namespace flashport::amd {
namespace {

/// "gfx942/attn_fwd_dropout_bf16_d128.co", "gfx942/attn_fwd_fp8_d128.co" (every fp8 format and output
/// type), "gfx942/attn_fwd_split_bf16_d128.co" (`split`: the attn_fwd_split entry): the naming of
/// cmake/hip_kernels.cmake.
std::string forward_object(const std::string& arch, const AttnProblem& p, bool split) {
  const int bucket = fwd_head_dim_bucket(p.d, p.dv);
  const std::string stem = arch + (split ? "/attn_fwd_split_" : "/attn_fwd_");
  if (is_fp8_elem(p.in_type)) return stem + "fp8_d" + std::to_string(bucket) + ".co";
  return stem + (p.dropout_p > 0.0f ? "dropout_" : "") + (p.in_type == kBF16 ? "bf16" : "f16") + "_d" +
         std::to_string(bucket) + ".co";
}

/// The kernels a call launches, for cached_kernel's integer keys.
enum class Site : unsigned {
  forward,
  forward_split,
  split_combine,
  bwd_dot,
  bwd_main,
  bwd_convert,
  kv_append,
  rotate_q,
  merge_states,
  index_check
};

/// cached_kernel's key of `site` for `p` at head-dim bucket `bucket` (< 512): what selects the code
/// object (fp8, dropout, dtype, bucket) and the entry (the site).
unsigned variant_key(Site site, const AttnProblem& p, int bucket) {
  return (unsigned)site << 24 | (unsigned)is_fp8_elem(p.in_type) << 20 |
         (unsigned)(p.dropout_p > 0.0f) << 19 | (unsigned)(p.in_type == kBF16) << 18 | (unsigned)bucket;
}

/// Deterministic backward: dQ slices at most (each block adds key tiles x, x + slices, ... into its own
/// slice): enough blocks with hk x batch of them, against slices x the accumulator's memory.
constexpr int kDeterministicSlices = 8;

/// The code-object arch (or the refusal) of a device, decided once per device: calls ask it twice.
const ArchChoice& arch_of(int device) {
  static std::mutex mu;
  static std::map<int, ArchChoice> choices;
  std::lock_guard<std::mutex> lock(mu);
  auto it = choices.find(device);
  if (it == choices.end()) it = choices.emplace(device, amd_arch_choice(device_arch_name(device))).first;
  return it->second;
}

/// The index check of `device` (index_check.cpp launches it).
KernelHandle index_check_kernel(int device) {
  const auto object = [&] { return arch_of(device).code_object + "/index_check.co"; };
  return cached_kernel(device, (unsigned)Site::index_check << 24, object, "index_check");
}

unsigned blocks_of(long long rows, long long per_block) {
  return (unsigned)((rows + per_block - 1) / per_block);
}

class HipBackend final : public core::Backend {
 public:
  const char* name() const override { return "hip"; }

  std::string unsupported(const AttnProblem& p, Impl impl, bool backward) const override {
    if (impl == Impl::reference || impl == Impl::baseline)
      return "the reference and baseline implementations are CPU only";
    if (backward && p.block_table) return "backward through paged K/V is not supported on AMD";
    if (backward && (p.kv_batch_idx || p.leftpad_k)) return "backward through a KV cache is not supported";
    if (std::string why = core::gpu_dtype_unsupported(p, backward, "AMD"); !why.empty()) return why;
    const bool fp8 = is_fp8_elem(p.in_type);
    if (p.s_dmask) return "s_dmask (attention probabilities) is produced by the CPU reference only";
    if (p.d % 8 != 0 || p.dv % 8 != 0)
      return "head dim must be a multiple of 8 on AMD, got d = " + std::to_string(p.d) +
             ", dv = " + std::to_string(p.dv);
    const int bucket = fwd_head_dim_bucket(p.d, p.dv);
    if (bucket == 0)
      return "head dim must be <= 256 on AMD, got d = " + std::to_string(p.d) +
             ", dv = " + std::to_string(p.dv);
    if (fp8 && p.dropout_p > 0.0f)
      return "dropout with fp8 inputs is not supported on AMD (no fp8 dropout variant)";
    if (fp8 && !fwd_has_fp8_variant(bucket))
      return "fp8 on AMD has kernels for head-dim buckets 64, 128 and 256 only (kFwdFp8Buckets), got d = " +
             std::to_string(p.d) + ", dv = " + std::to_string(p.dv);
    if (p.dropout_p > 0.0f && !fwd_has_dropout_variant(bucket))
      return "dropout on AMD has kernels for head-dim buckets 64 and 128 only (kFwdDropoutBuckets), got d "
             "= " +
             std::to_string(p.d);
    if (p.sq > INT32_MAX || p.sk > INT32_MAX)
      return "sequence lengths must be below 2^31 on AMD, got " + std::to_string(p.sq) + " x " +
             std::to_string(p.sk);
    if (p.batch > kMaxGridYZ || p.hq > kMaxGridYZ)
      return "at most " + std::to_string(kMaxGridYZ) +
             " sequences and query heads on AMD (launch grid y/z), got " + std::to_string(p.batch) +
             " sequences of " + std::to_string(p.hq) + " heads";
    if (p.device < 0 || p.device >= device_count())
      return "device hip:" + std::to_string(p.device) + " is not visible (" + std::to_string(device_count()) +
             " GPUs)";
    return arch_of(p.device).reason;
  }

  // Each call first reports what the device found wrong with an earlier call's index tensors, then
  // queues the check of its own ahead of its kernels (index_check.hpp), as the CUDA backend does.
  void forward(const AttnProblem& p, Impl) const override {
    raise_device_fault(p.device);
    check_indices_async(p, kCallForward, index_check_kernel);
    run_forward(p, 0);
  }

  /// The forward with `num_splits` (0: the heuristic, 1: off, n: n splits; fwd_num_splits decides):
  /// attn_fwd, or attn_fwd_split into fp32 workspaces from the stream-ordered pool and split_combine
  /// over them, on the call's stream with no synchronisation (the CUDA launcher's sequence).
  void run_forward(const AttnProblem& p, int num_splits) const {
    if (p.sq == 0 || p.hq == 0 || p.batch == 0) return;  // no query: nothing to write
    const int bucket = fwd_head_dim_bucket(p.d, p.dv);
    const FwdTile tile = fwd_tile(bucket);
    const long long pack = gqa_pack(p, tile.block_m);
    const int splits = fwd_num_splits(p, num_splits, device_cu_count(p.device));
    FwdParams prm{p, fwd_vec_flags(p), (int)pack, nullptr, nullptr, splits};
    const bool split = splits > 1;
    const FwdGrid grid = fwd_grid(p, tile.block_m, pack, splits);
    const Launch l{{grid.x, grid.y, grid.z}, (unsigned)(tile.waves * 64), &prm};
    const auto object = [&] { return forward_object(arch_of(p.device).code_object, p, split); };
    const KernelHandle kernel =
        split ? cached_kernel(p.device, variant_key(Site::forward_split, p, bucket), object, "attn_fwd_split")
              : cached_kernel(p.device, variant_key(Site::forward, p, bucket), object, "attn_fwd");
    if (!split) return launch(p.device, kernel, l, p.stream);
    const long long rows = splits * fwd_split_rows(p);
    const size_t o_bytes = (size_t)(rows * p.dv) * sizeof(float), lse_bytes = (size_t)rows * sizeof(float);
    AsyncScratch ws(p.device, o_bytes + lse_bytes, p.stream);
    prm.o_partial = reinterpret_cast<float*>(ws.bytes());  // o_bytes is a multiple of 32 (dv of 8)
    prm.lse_partial = reinterpret_cast<float*>(ws.bytes() + o_bytes);
    launch(p.device, kernel, l, p.stream);
    const FwdGrid cg = fwd_combine_grid(p);
    const auto combine_object = [&] { return arch_of(p.device).code_object + "/split_combine.co"; };
    launch(p.device,
           cached_kernel(p.device, variant_key(Site::split_combine, p, 0), combine_object, "split_combine"),
           Launch{{cg.x, cg.y, cg.z}, (unsigned)kCombineThreads, &prm}, p.stream);
    ws.free();
  }

  /// attn_bwd_dot_do_o (D, dQ accumulator zeroed), attn_bwd (dK, dV; dQ accumulated), then
  /// attn_bwd_convert_dq, on one stream, with the fp32 workspaces from the stream-ordered pool.
  void backward(const AttnProblem& p, Impl) const override {
    raise_device_fault(p.device);
    check_indices_async(p, kCallBackward, index_check_kernel);
    if (p.batch == 0 || p.hq == 0) return;
    const int bucket = bwd_head_dim_bucket(p.d, p.dv);
    const int slices = bwd_num_slices(p, bucket, kDeterministicSlices);
    const long long d_floats = bwd_d_elems(p), dq_floats = slices * bwd_dq_slice_elems(p);
    const long long d_padded = (d_floats + 63) / 64 * 64;  // 256-byte aligned dQ accumulator
    AsyncScratch scratch(p.device, (size_t)(d_padded + dq_floats) * 4, p.stream);
    float* ws = reinterpret_cast<float*>(scratch.bytes());
    const BwdParams prm{p, ws, ws + d_padded, slices, bwd_vec_flags(p)};
    const auto object = [&] {
      return arch_of(p.device).code_object + "/attn_bwd_" + (p.in_type == kBF16 ? "bf16" : "f16") + "_d" +
             std::to_string(bucket) + ".co";
    };
    const auto bwd_kernel = [&](Site site, const char* entry) {
      return cached_kernel(p.device, variant_key(site, p, bucket), object, entry);
    };
    const unsigned rows = blocks_of(p.sq, kBwdRowsPerBlock);
    const long long tiles = bwd_key_tiles(p, bucket);
    const Launch row_launch{{rows, (unsigned)p.hq, (unsigned)p.batch}, (unsigned)kBwdRowThreads, &prm};
    const Launch key_launch{{(unsigned)(p.deterministic ? slices : tiles), (unsigned)p.hk, (unsigned)p.batch},
                            (unsigned)(bwd_tile(bucket).waves * 64),
                            &prm};
    if (rows > 0) launch(p.device, bwd_kernel(Site::bwd_dot, "attn_bwd_dot_do_o"), row_launch, p.stream);
    if (tiles > 0) launch(p.device, bwd_kernel(Site::bwd_main, "attn_bwd"), key_launch, p.stream);
    if (rows > 0)
      launch(p.device, bwd_kernel(Site::bwd_convert, "attn_bwd_convert_dq"), row_launch, p.stream);
    scratch.free();
  }

  /// kv_append (when appending; rotary on k), rotate_q into a dense (b, sq, hq, d) scratch from the
  /// stream-ordered pool (with rotary), then the forward over the updated cache reading q from there,
  /// split by kp.num_splits: test_hip_kvcache.cpp's sequence, the CUDA launcher's too.
  void forward_kvcache(const core::KvCacheProblem& kp, Impl) const override {
    const AttnProblem& a = kp.attn;
    core::refuse_fp8_cache_update(kp, "hip", "AMD");
    raise_device_fault(a.device);
    check_indices_async(a, kCallKvCache, index_check_kernel);
    KvAppendParams prm = core::append_params(kp);
    const auto object = [&] { return arch_of(a.device).code_object + "/kvcache_append.co"; };
    if (kp.k_new.ptr && kp.s_new > 0 && a.batch > 0) {
      const Launch l{{blocks_of(a.batch * kp.s_new * a.hk, kKvWaves), 1, 1}, (unsigned)kKvThreads, &prm};
      launch(a.device, cached_kernel(a.device, variant_key(Site::kv_append, a, 0), object, "kv_append"), l,
             a.stream);
    }
    if (kp.rotary_dim <= 0 || !kp.cache_seqlens) return run_forward(a, kp.num_splits);
    const long long q_rows = a.batch * a.sq * a.hq;
    if (q_rows <= 0) return;
    AsyncScratch q_rot(a.device, (size_t)(q_rows * a.d) * 2, a.stream);  // fp16 / bf16
    prm.q_rot = q_rot.bytes();
    const Launch l{{blocks_of(q_rows, kKvWaves), 1, 1}, (unsigned)kKvThreads, &prm};
    launch(a.device, cached_kernel(a.device, variant_key(Site::rotate_q, a, 0), object, "rotate_q"), l,
           a.stream);
    AttnProblem rotated = a;
    rotated.q = {prm.q_rot, a.sq * a.hq * a.d, a.hq * a.d, a.d};
    run_forward(rotated, kp.num_splits);
    q_rot.free();
  }

  void check_device(int device) const override { synchronize_and_raise(device); }

  /// One wave per merged row (merge_states.hpp), on the call's stream.
  void merge_states(const core::MergeProblem& mp) const override {
    const long long rows = mp.batch * mp.heads * mp.seqlen;
    if (rows == 0) return;
    const int device = mp.device;
    raise_device_fault(device);
    if (device < 0 || device >= device_count())
      throw Error("out", "hip backend: device hip:" + std::to_string(device) + " is not visible");
    if (const std::string& why = arch_of(device).reason; !why.empty())
      throw Error("out", "hip backend: " + why);
    MergeParams prm = core::merge_params(mp);
    const auto object = [&] { return arch_of(device).code_object + "/merge_states.co"; };
    const Launch l{{blocks_of(rows, kMergeWaves), 1, 1}, (unsigned)kMergeThreads, &prm};
    launch(device, cached_kernel(device, (unsigned)Site::merge_states << 24, object, "merge_states"), l,
           mp.stream);
  }
};

}  // namespace

const core::Backend* backend() {
  static const HipBackend instance;
  return runtime_unavailable().empty() ? &instance : nullptr;
}

}  // namespace flashport::amd
