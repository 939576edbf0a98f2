// The CPU wave64 model's runtime: lanes as fibers (ucontext to start them, _setjmp/_longjmp to switch:
// no signal-mask system call per switch), block barriers and wave collectives as counted phase points.
// _FORTIFY_SOURCE's longjmp check rejects jumps between fiber stacks, so it is off in this file.
#undef _FORTIFY_SOURCE
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#ifndef FP_WAVE_MODEL
#define FP_WAVE_MODEL 1
#endif
#include "wave/wave.hpp"

namespace flashport::wave::model {

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxLdsBytes = 64 * 1024;  // LDS per workgroup on gfx90a and gfx94x

struct Lane {
  jmp_buf resume;
  ucontext_t start;
  bool started = false, done = false;
};

struct WaveState {
  int live = 0, arrived = 0;
  unsigned gen = 0;
  alignas(16) unsigned char slots[kWaveSize][kSlotBytes];
};

struct Block {
  std::vector<Lane> lanes;
  std::vector<WaveState> waves;
  int live = 0, arrived = 0;
  unsigned gen = 0;
  long long releases = 0;  // progress counter for deadlock detection
  int current = -1;
  jmp_buf scheduler;
  const std::function<void(unsigned char*)>* kernel = nullptr;
  unsigned char* lds = nullptr;
};

Block* g_block = nullptr;
Dim3 g_block_index, g_grid;
std::vector<std::unique_ptr<char[]>> g_stacks;
std::mt19937 g_order_rng(2024);
long long g_collectives = 0;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "wave model: %s (block %u,%u,%u, lane %d)\n", msg.c_str(), g_block_index.x,
               g_block_index.y, g_block_index.z, g_block ? g_block->current : -1);
  std::abort();
}

Lane& me() {
  return g_block->lanes[(size_t)g_block->current];
}
WaveState& my_wave() {
  return g_block->waves[(size_t)g_block->current / kWaveSize];
}

void yield() {
  if (!_setjmp(me().resume)) _longjmp(g_block->scheduler, 1);
}

void wave_sync(WaveState& w) {
  const unsigned gen = w.gen;
  if (++w.arrived == w.live) {
    w.arrived = 0, ++w.gen, ++g_block->releases;
    return;
  }
  while (w.gen == gen) yield();
}

void lane_entry() {
  Block& b = *g_block;
  (*b.kernel)(b.lds);
  Lane& lane = me();
  WaveState& w = my_wave();
  if (w.arrived > 0) die("a lane exits while its wave waits in a collective");
  lane.done = true;
  --b.live, --w.live, ++b.releases;
  // An exited lane no longer holds block barriers back (the hardware counts waves; a kernel whose
  // lanes exit unevenly before a barrier is wrong there anyway, and the wave checks above catch it).
  if (b.live > 0 && b.arrived == b.live) b.arrived = 0, ++b.gen;
  _longjmp(b.scheduler, 1);
}

void run_block(Block& b, int threads) {
  b.lanes = std::vector<Lane>((size_t)threads);
  b.waves = std::vector<WaveState>((size_t)threads / kWaveSize);
  for (WaveState& w : b.waves) w.live = kWaveSize;
  b.live = threads;
  g_block = &b;
  for (int t = 0; t < threads; ++t) {
    Lane& lane = b.lanes[(size_t)t];
    getcontext(&lane.start);
    lane.start.uc_stack.ss_sp = g_stacks[(size_t)t].get();
    lane.start.uc_stack.ss_size = kStackBytes;
    lane.start.uc_link = nullptr;  // lane_entry never returns: it jumps back to the scheduler
    makecontext(&lane.start, lane_entry, 0);
  }
  std::vector<int> order((size_t)threads);
  for (int t = 0; t < threads; ++t) order[(size_t)t] = t;
  int idle_rounds = 0;
  while (b.live > 0) {
    std::shuffle(order.begin(), order.end(), g_order_rng);  // varied interleavings expose races
    const long long before = b.releases;
    for (int t : order) {
      Lane& lane = b.lanes[(size_t)t];
      if (lane.done) continue;
      b.current = t;
      if (!_setjmp(b.scheduler)) {
        if (!lane.started) {
          lane.started = true;
          setcontext(&lane.start);
        }
        _longjmp(lane.resume, 1);
      }
    }
    idle_rounds = b.releases == before ? idle_rounds + 1 : 0;
    if (idle_rounds > 3) die("deadlock: lanes wait at barriers that can never complete");
  }
  g_block = nullptr;
}

}  // namespace

int thread_id() {
  return g_block->current;
}
Dim3 block_index() {
  return g_block_index;
}
Dim3 grid_dim() {
  return g_grid;
}

void block_sync() {
  Block& b = *g_block;
  const unsigned gen = b.gen;
  if (++b.arrived == b.live) {
    b.arrived = 0, ++b.gen, ++b.releases;
    return;
  }
  while (b.gen == gen) yield();
}

const unsigned char* wave_gather(const void* mine, int bytes) {
  WaveState& w = my_wave();
  if (w.live != kWaveSize) die("wave collective with " + std::to_string(w.live) + " live lanes");
  std::memcpy(w.slots[g_block->current % kWaveSize], mine, (size_t)bytes);
  wave_sync(w);
  return &w.slots[0][0];
}

void wave_release() {
  ++g_collectives;
  wave_sync(my_wave());
}

long long collectives() {
  return g_collectives / kWaveSize;
}

void launch(Dim3 grid, int threads, int lds_bytes, const std::function<void(unsigned char* lds)>& kernel) {
  if (threads <= 0 || threads % kWaveSize != 0) die("threads per block must be a multiple of 64");
  if (lds_bytes > kMaxLdsBytes) die("LDS of " + std::to_string(lds_bytes) + " bytes above 64 KiB");
  while (g_stacks.size() < (size_t)threads) g_stacks.emplace_back(new char[kStackBytes]);
  g_grid = grid;
  // Blocks run one at a time in a shuffled order (the hardware gives no order either), so a kernel whose
  // result depends on the order of its blocks (atomics summing floats) varies between launches.
  std::vector<Dim3> blocks;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.push_back({x, y, z});
  std::shuffle(blocks.begin(), blocks.end(), g_order_rng);
  for (const Dim3& index : blocks) {
    g_block_index = index;
    std::vector<unsigned char> lds((size_t)std::max(lds_bytes, 1),
                                   0xFF);  // sized exactly: ASan sees overruns
    Block b;
    b.kernel = &kernel;
    b.lds = lds.data();
    run_block(b, threads);
  }
}

}  // namespace flashport::wave::model
