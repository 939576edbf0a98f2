// A CPU emulator for the CUDA kernels: every GPU thread of a block is a cooperative fiber
// (ucontext), barriers and warp collectives (shuffles, ldmatrix, mma.sync) follow the PTX ISA, and
// the jit:: driver API is replaced so the real CUDA backend launches the emulated kernels (emu_sm90.cpp:
// the Hopper side). Slow (seconds per small case); it exists to find layout, pipeline and bounds bugs
// without a GPU.
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/numeric.h"
#include "emu_cuda.hpp"
#include "emu_kernels.hpp"
#include "emu_sm90.hpp"
#include "flashport/error.hpp"
#include "jit/jit.hpp"

namespace flashport::emu {

Dim3 g_block_index, g_grid_dim, g_block_dim;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "emu: %s (block %u,%u,%u)\n", msg.c_str(), g_block_index.x, g_block_index.y,
               g_block_index.z);
  std::abort();
}

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kSharedBytes = 232448;  // sm_90's per-block maximum (227 KB)

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  bool pred;
};

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  Dim3 tid;
  bool done = false;
  const char* waits_for = "";  // the barrier it last waited at, and its address (deadlock reports)
  unsigned waits_at = 0;
  std::vector<std::vector<Copy>> groups{{}};  // committed groups, then the open one (last)
};

/// A barrier over the live threads of a warp, a CTA or a cluster: each arrival waits until its generation
/// completes; a thread that exits stops being waited for (`leave`).
struct Barrier {
  int live = 0, arrived = 0;
  unsigned gen = 0;
  bool arrive() {  // true when this arrival completes the generation
    if (++arrived < live) return false;
    arrived = 0, ++gen;
    return true;
  }
  void leave() {
    if (--live > 0 && arrived == live) arrived = 0, ++gen;
  }
};

struct WarpState {
  Barrier bar;
  alignas(16) unsigned char slots[32][64];
};

/// A named barrier (bar.sync / bar.arrive with a thread count). As on the GPU it counts warps: a thread
/// waits until every non-exited thread of its warp has arrived, which marks 32 arrivals; the barrier
/// completes at `count`. So one thread whose warp-mates exited arrives for its warp, and a warp-mate that
/// is live but never arrives holds the warp (a deadlock report).
struct NamedBarrier {
  unsigned arrived = 0, gen = 0;
  std::array<unsigned, 32> lanes{}, warp_gen{};  // per warp: lanes arrived, warp arrivals marked
};

struct BlockState {
  std::vector<Fiber> fibers;
  std::array<NamedBarrier, 16> named;
  ucontext_t main;
  int current = -1;
  Barrier bar;  // __syncthreads; bar.live: the CTA's threads still running
  std::vector<WarpState> warps;
  long long releases = 0;           // progress counter for deadlock detection
  Dim3 index;                       // blockIdx
  unsigned rank = 0;                // %cluster_ctarank
  unsigned char* shared = nullptr;  // this CTA's dynamic shared memory
};

/// The CTAs running together: one, or a thread-block cluster (along grid x), whose barrier counts every
/// live thread of its CTAs.
struct ClusterState {
  std::vector<BlockState>* blocks = nullptr;
  Barrier bar;
};

BlockState* g_block = nullptr;  // the running fiber's CTA; g_shared and g_block_index follow it
ClusterState g_cluster;
alignas(128) unsigned char g_shared_single[kSharedBytes];  // a lone CTA's shared memory
std::vector<std::vector<unsigned char>> g_shared_cluster;  // a cluster's, one buffer per CTA
unsigned char* g_shared = g_shared_single;
size_t g_shared_limit = 0;
bool g_lazy_copies = false;
std::mt19937 g_sched_rng(12345);

Fiber& me() {
  return g_block->fibers[(size_t)g_block->current];
}

void yield() {
  swapcontext(&me().ctx, &g_block->main);
}

void perform(const Copy& c) {
  if (c.pred)
    std::memcpy(c.dst, c.src, 16);
  else
    std::memset(c.dst, 0, 16);
}

}  // namespace

const Dim3& thread_index() {
  return me().tid;
}
unsigned char* dynamic_shared() {
  return g_shared;
}

namespace {
void wait_at(Barrier& bar) {
  me().waits_for = &bar == &g_block->bar    ? "__syncthreads"
                   : &bar == &g_cluster.bar ? "cluster barrier"
                                            : "__syncwarp";
  const unsigned gen = bar.gen;
  if (bar.arrive()) {
    ++g_block->releases;
    return;
  }
  while (bar.gen == gen) yield();
}
}  // namespace

void sync_block() {
  wait_at(g_block->bar);
}

void sync_cluster() {
  wait_at(g_cluster.bar);
}

unsigned cluster_rank() {
  return g_block->rank;
}
unsigned cluster_size() {
  return (unsigned)g_cluster.blocks->size();
}

float ld_cluster_f32(unsigned cluster_addr) {
  float v;
  std::memcpy(&v, shared_at(cluster_addr, 4), 4);
  return v;
}

void sync_warp() {
  wait_at(g_block->warps[me().tid.x / 32].bar);
}

void spin(const char* what, unsigned addr) {
  me().waits_for = what, me().waits_at = addr;
  yield();
}
void progress() {
  ++g_block->releases;
}

void named_bar(unsigned id, unsigned count, bool wait) {
  if (id >= 16 || count == 0 || count % 32 != 0 || count > g_block_dim.x)
    die("bar.sync / bar.arrive " + std::to_string(id) + " with " + std::to_string(count) + " threads");
  NamedBarrier& b = g_block->named[id];
  const unsigned warp = me().tid.x / 32, gen = b.gen, warp_gen = b.warp_gen[warp];
  ++b.lanes[warp];
  ++g_block->releases;
  // The warp's arrival, marked by whichever lane finds all its non-exited warp-mates here.
  while (b.warp_gen[warp] == warp_gen) {
    if (b.lanes[warp] >= (unsigned)g_block->warps[warp].bar.live) {
      b.lanes[warp] = 0, ++b.warp_gen[warp];
      if ((b.arrived += 32) == count) b.arrived = 0, ++b.gen;
      ++g_block->releases;
      break;
    }
    spin("named barrier (warp-mates)", id);
  }
  if (wait)
    while (b.gen == gen) spin("named barrier", id);
}

unsigned char* shared_at(unsigned addr, unsigned bytes) {
  const unsigned rank = addr >> 24, offset = addr & 0xffffffu;
  unsigned char* base = g_shared;
  if (rank != 0) {
    if (rank - 1 >= cluster_size()) die("shared::cluster address of rank " + std::to_string(rank - 1));
    base = (*g_cluster.blocks)[rank - 1].shared;
  }
  if (offset % std::min(bytes, 16u) != 0 || offset + bytes > g_shared_limit)
    die("shared access of " + std::to_string(bytes) + " bytes at " + std::to_string(offset) +
        " unaligned or beyond the dynamic smem (" + std::to_string(g_shared_limit) + " bytes)");
  return base + offset;
}

namespace {

/// Deposits `in` in this lane's slot, waits for the warp, runs `body(slots)`, waits again.
template <class In, class Body>
void collective(const In& in, Body body) {
  static_assert(sizeof(In) <= 64, "slot size");
  WarpState& w = g_block->warps[me().tid.x / 32];
  if (w.bar.live != 32) die("warp collective with " + std::to_string(w.bar.live) + " live lanes");
  std::memcpy(w.slots[me().tid.x % 32], &in, sizeof(In));
  sync_warp();
  body(w.slots);
  sync_warp();
}

template <class T>
T slot(const unsigned char (*slots)[64], int lane) {
  T v;
  std::memcpy(&v, slots[lane], sizeof(T));
  return v;
}

float elem(bool bf16, unsigned short h) {
  return bf16 ? num::bf16_to_f32(h) : num::f16_to_f32(h);
}

}  // namespace

unsigned shfl_xor_bits(unsigned v, int mask) {
  unsigned out = 0;
  const int lane = (int)(me().tid.x % 32);
  collective(v, [&](const unsigned char(*s)[64]) { out = slot<unsigned>(s, lane ^ mask); });
  return out;
}

long long shfl_i64(long long v, int src) {
  long long out = 0;
  collective(v, [&](const unsigned char(*s)[64]) { out = slot<long long>(s, src); });
  return out;
}

void warp_gather(const void* in, size_t bytes, void* out) {
  if (bytes > 64) die("warp_gather of more than 64 bytes per lane");
  unsigned char buf[64] = {};
  std::memcpy(buf, in, bytes);
  collective(buf, [&](const unsigned char(*s)[64]) {
    for (int l = 0; l < 32; ++l) std::memcpy(static_cast<unsigned char*>(out) + l * bytes, s[l], bytes);
  });
}

void mma_16816(bool bf16, float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  struct In {
    unsigned a[4], b[2];
    float c[4];
  } in;
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, c, sizeof(in.c));
  const int lane = (int)(me().tid.x % 32);
  collective(in, [&](const unsigned char(*s)[64]) {
    // PTX ISA fragment layouts for mma.m16n8k16 with 16-bit A/B and fp32 C/D:
    // A: a0,a1 (g, 2t+i), a2,a3 (g+8, 2t+i), a4,a5 (g, 2t+8+i), a6,a7 (g+8, 2t+8+i);
    // B: b0,b1 (k 2t+i, n g), b2,b3 (k 2t+8+i, n g); C: c0,c1 (g, 2t+i), c2,c3 (g+8, 2t+i).
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      const In x = slot<In>(s, l);
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 2; ++i) {
        auto half = [&](unsigned r) { return elem(bf16, (unsigned short)(i ? r >> 16 : r & 0xffffu)); };
        A[g][2 * t + i] = half(x.a[0]);
        A[g + 8][2 * t + i] = half(x.a[1]);
        A[g][2 * t + 8 + i] = half(x.a[2]);
        A[g + 8][2 * t + 8 + i] = half(x.a[3]);
        B[2 * t + i][g] = half(x.b[0]);
        B[2 * t + 8 + i][g] = half(x.b[1]);
        C[g][2 * t + i] = x.c[i];
        C[g + 8][2 * t + i] = x.c[2 + i];
      }
    }
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      float acc = C[row][col];
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
      c[e] = acc;
    }
  });
}

void ldmatrix(unsigned* r, int count, bool trans, unsigned smem_row) {
  const int lane = (int)(me().tid.x % 32);
  if (lane < 8 * count && (smem_row % 16 != 0 || smem_row + 16 > g_shared_limit))
    die("ldmatrix row address " + std::to_string(smem_row) + " unaligned or beyond the dynamic smem (" +
        std::to_string(g_shared_limit) + " bytes)");
  collective(smem_row, [&](const unsigned char(*s)[64]) {
    // Lanes 8i..8i+7 address the rows of matrix i. Without .trans thread `lane` gets row lane/4,
    // columns 2(lane%4), +1; with .trans it gets column lane/4 of rows 2(lane%4), +1.
    for (int i = 0; i < count; ++i) {
      unsigned short v[2];
      for (int e = 0; e < 2; ++e) {
        const int row = trans ? 2 * (lane % 4) + e : lane / 4;
        const int col = trans ? lane / 4 : 2 * (lane % 4) + e;
        const unsigned addr = slot<unsigned>(s, 8 * i + row) + 2 * col;
        std::memcpy(&v[e], g_shared + addr, 2);
      }
      r[i] = (unsigned)v[0] | (unsigned)v[1] << 16;
    }
  });
}

void cp_async(void* smem_dst, const void* src, bool pred) {
  auto* dst = static_cast<unsigned char*>(smem_dst);
  if ((dst - g_shared) % 16 != 0 || dst < g_shared || dst + 16 > g_shared + g_shared_limit)
    die("cp.async shared destination unaligned or outside the dynamic smem");
  if (pred && reinterpret_cast<uintptr_t>(src) % 16 != 0) die("cp.async global source not 16-byte aligned");
  const Copy c{dst, static_cast<const unsigned char*>(src), pred};
  if (g_lazy_copies)
    me().groups.back().push_back(c);
  else
    perform(c);
}

void cp_async_commit() {
  me().groups.emplace_back();
}

void cp_async_wait(int pending) {
  auto& groups = me().groups;  // committed groups are all but the last (open) one
  while ((int)groups.size() - 1 > pending) {
    for (const Copy& c : groups.front()) perform(c);
    groups.erase(groups.begin());
  }
}

namespace {

void fiber_entry(unsigned lo, unsigned hi) {
  auto* launch = reinterpret_cast<const KernelLaunch*>((uintptr_t)lo | (uintptr_t)hi << 32);
  launch->fn(launch->args);
  Fiber& f = me();
  // Outstanding lazy copies land when the thread exits (the hardware finishes them too).
  for (auto& g : f.groups)
    for (const Copy& c : g) perform(c);
  f.done = true;
  // A thread that exits lets barriers complete without it.
  g_block->bar.leave();
  g_block->warps[f.tid.x / 32].bar.leave();
  g_cluster.bar.leave();
  ++g_block->releases;
}

/// Runs the CTAs first.x .. first.x + size - 1 (a cluster of `size` along x; 1: a lone CTA) together,
/// their warps interleaved in a random order each round.
void run_cluster(const KernelLaunch& launch, unsigned threads, Dim3 first, unsigned size) {
  std::vector<BlockState> blocks(size);
  if (size > 1 && g_shared_cluster.size() < size) g_shared_cluster.resize(size);
  g_cluster = {&blocks, {(int)(threads * size), 0, 0}};
  const uintptr_t ptr = reinterpret_cast<uintptr_t>(&launch);
  std::vector<std::pair<unsigned, unsigned>> order, warp_order;  // (CTA, thread), (CTA, warp)
  for (unsigned k = 0; k < size; ++k) {
    BlockState& b = blocks[k];
    b.index = {first.x + k, first.y, first.z};
    b.rank = k;
    if (size == 1) {
      b.shared = g_shared_single;
    } else {
      g_shared_cluster[k].resize(g_shared_limit);
      b.shared = g_shared_cluster[k].data();
    }
    std::memset(b.shared, 0xFF, g_shared_limit);  // NaN everywhere a kernel reads unwritten smem
    b.fibers.resize(threads);
    b.bar.live = (int)threads;
    b.warps.resize((threads + 31) / 32);
    for (unsigned t = 0; t < threads; ++t) b.warps[t / 32].bar.live++;
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = b.fibers[t];
      f.tid = {t, 0, 0};
      f.stack.reset(new char[kStackBytes]);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = kStackBytes;
      f.ctx.uc_link = &b.main;
      makecontext(&f.ctx, (void (*)())fiber_entry, 2, (unsigned)(ptr & 0xffffffffu), (unsigned)(ptr >> 32));
      if (t % 32 == 0) warp_order.emplace_back(k, t / 32);
    }
  }
  const auto live = [&] {
    int n = 0;
    for (const BlockState& b : blocks) n += b.bar.live;
    return n;
  };
  const auto releases = [&] {
    long long n = 0;
    for (const BlockState& b : blocks) n += b.releases;
    return n;
  };
  int idle_rounds = 0;
  while (live() > 0) {
    // Warps in a varied order each round (interleavings that expose races), the lanes of a warp one after
    // another: a warp runs in step on the GPU, and a lane left far behind its warp-mates could otherwise
    // find a barrier they passed completed again and wait for a phase they will never start.
    std::shuffle(warp_order.begin(), warp_order.end(), g_sched_rng);
    order.clear();
    for (const auto& [k, w] : warp_order)
      for (unsigned t = 32 * w; t < std::min(threads, 32 * w + 32); ++t) order.emplace_back(k, t);
    const long long before = releases();
    for (const auto& [k, t] : order) {
      BlockState& b = blocks[k];
      if (b.fibers[t].done) continue;
      g_block = &b, g_shared = b.shared, g_block_index = b.index;
      b.current = (int)t;
      swapcontext(&b.main, &b.fibers[t].ctx);
    }
    idle_rounds = releases() == before ? idle_rounds + 1 : 0;
    if (idle_rounds > 3) {
      std::map<std::string, std::string> waiting;  // barrier -> the threads waiting there
      for (const auto& [k, t] : order)
        if (const Fiber& f = blocks[k].fibers[t]; !f.done)
          waiting[std::string(f.waits_for) + " " + std::to_string(f.waits_at)] +=
              " " + std::to_string(k) + ":" + std::to_string(t);
      for (const auto& [what, threads] : waiting)
        std::fprintf(stderr, "emu: waiting at %s:%s\n", what.c_str(), threads.substr(0, 400).c_str());
      die("deadlock: threads wait at barriers that can never complete");
    }
  }
  g_block = nullptr, g_shared = g_shared_single;
  g_cluster = {};
}

}  // namespace

namespace {
long long g_cluster_launches = 0;
}  // namespace

long long cluster_launches() {
  return g_cluster_launches;
}

void launch_grid(const KernelLaunch& launch, Dim3 grid, unsigned threads, size_t dynamic_smem,
                 unsigned cluster_x) {
  if (dynamic_smem > kSharedBytes) die("dynamic smem " + std::to_string(dynamic_smem) + " above 227 KB");
  const char* lazy = std::getenv("FLASHPORT_EMU_LAZY_COPIES");
  g_lazy_copies = lazy && *lazy == '1';
  g_shared_limit = dynamic_smem;
  g_grid_dim = grid;
  g_block_dim = {threads, 1, 1};
  if (cluster_x < 1 || grid.x % cluster_x != 0) die("grid x not a multiple of the cluster size");
  if (cluster_x > 1) ++g_cluster_launches;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; x += cluster_x) run_cluster(launch, threads, {x, y, z}, cluster_x);
}

}  // namespace flashport::emu

// ---------------------------------------------------------------------------------------------
// The jit:: driver API, emulated: every pointer is "device 0", kernels come from emu_kernels.

namespace flashport::jit {

namespace {
// The forward-side suites test the portable kernels: the dispatcher stays off the Hopper forward (the Hopper
// suites call hopper::forward directly; the backward's dispatch is left automatic, so they reach the Hopper
// backward through backward()).
const bool g_portable_forward = [] { return setenv("FLASHPORT_CUDA_FORWARD", "portable", 0) == 0; }();

int emu_arch() {
  const char* a = std::getenv("FLASHPORT_EMU_ARCH");
  return a ? std::atoi(a) : 90;
}
std::mutex g_kernels_mutex;
std::map<std::string, std::unique_ptr<Kernel>> g_kernels;
}  // namespace

bool driver_available() {
  return true;
}
int device_count() {
  return 1;
}
int pointer_device(const void*) {
  return 0;
}
int device_arch(int) {
  return emu_arch();
}
int device_sm_count(int) {
  return 132;
}
// Stream-ordered scratch arrives filled with NaN bytes (0xff), never zeroed: a kernel that reads scratch
// nobody wrote (a dQ accumulator left unzeroed, a split's unwritten partial) then fails its test here.
void* alloc_async(size_t bytes, void*) {
  const size_t size = (bytes + 255) / 256 * 256 + 256;
  void* ptr = std::aligned_alloc(256, size);
  if (ptr) std::memset(ptr, 0xff, size);
  return ptr;
}
void free_async(void* ptr, void*) {
  std::free(ptr);
}
void memset_async(void* ptr, unsigned char value, size_t bytes, void*) {
  std::memset(ptr, value, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes, void*) {
  std::memcpy(dst, src, bytes);
}
void stream_synchronize(void*) {}  // launches run to completion before they return
void device_synchronize(int) {}
// The device checks' fault record: plain host memory (the emulator's device memory is host memory).
// The emulator does not run index_check.cu (its warp reductions are not emulated), so device checks are
// off by default below; with FLASHPORT_DEVICE_CHECKS=1 (ctest emu.device_checks) the decode kernel's own
// check reports here.
const MappedMemory& fault_memory(int) {
  alignas(16) static unsigned char record[kFaultMemoryBytes] = {};
  static const MappedMemory memory{record, record};
  return memory;
}
namespace {
// Before the first tuning() read (static initialisation precedes main): FLASHPORT_DEVICE_CHECKS=0
// unless the caller set it.
const bool g_device_checks_off = [] { return setenv("FLASHPORT_DEVICE_CHECKS", "0", 0) == 0; }();
}  // namespace
std::string device_name(int) {
  return "flashport CUDA emulator (sm_" + std::to_string(emu_arch()) + ")";
}
int driver_version() {
  return 12080;
}
float time_ms(int, void*, const std::function<void()>&, int, int) {
  throw Error("autotune", "the emulator has no timer (FLASHPORT_AUTOTUNE needs a GPU)");
}
namespace detail {
int driver_cuda_version() {
  return 12080;
}
}  // namespace detail

const Kernel& get(const KernelSpec& spec, int device, int dynamic_smem) {
  std::lock_guard<std::mutex> lock(g_kernels_mutex);
  auto& k = g_kernels[spec.key()];
  if (!k) {
    const emu::KernelFn fn = emu::find_kernel(spec);
    if (!fn) throw Error("kernel " + spec.key(), "not compiled into the emulator (tests/gpu/emu/build.sh)");
    k = std::make_unique<Kernel>();
    k->function = reinterpret_cast<void*>(fn);
    k->device = device;
    k->key = spec.key();
  }
  k->max_dynamic_smem = std::max(k->max_dynamic_smem, dynamic_smem);
  return *k;
}

namespace {
std::mutex g_cached_mutex;
std::map<std::tuple<const void*, std::array<int, 8>, int, int>, const Kernel*> g_cached;
}  // namespace

const Kernel* find_cached(const SpecKey& key, int device, int dynamic_smem) {
  std::lock_guard<std::mutex> lock(g_cached_mutex);
  const auto it = g_cached.find({key.builder, key.values, device, dynamic_smem});
  return it == g_cached.end() ? nullptr : it->second;
}
void remember_cached(const SpecKey& key, int device, int dynamic_smem, const Kernel& kernel) {
  std::lock_guard<std::mutex> lock(g_cached_mutex);
  g_cached.emplace(std::make_tuple(key.builder, key.values, device, dynamic_smem), &kernel);
}

// `order` is moot here: the emulator runs one grid at a time, each to completion.
void launch(const Kernel& kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
            int dynamic_smem, void*, void** args, unsigned cluster_x, LaunchOrder) {
  if (dynamic_smem > kernel.max_dynamic_smem)
    throw Error("kernel " + kernel.key, "dynamic smem above get()'s");
  static const bool verbose = std::getenv("FLASHPORT_EMU_VERBOSE") != nullptr;
  if (verbose)
    std::fprintf(stderr, "emu launch %s grid (%u,%u,%u) block %u smem %d\n", kernel.key.c_str(), grid_x,
                 grid_y, grid_z, block_x, dynamic_smem);
  const emu::KernelLaunch launch{reinterpret_cast<emu::KernelFn>(kernel.function), args};
  emu::launch_grid(launch, {grid_x, grid_y, grid_z}, block_x, (size_t)dynamic_smem, cluster_x);
}

}  // namespace flashport::jit
