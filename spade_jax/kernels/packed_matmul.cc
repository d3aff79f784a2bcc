// y[M, N] = x[M, K] @ w for a float32 weight stored packed as [N / 16][K][16]: each 16-column
// block of w is one contiguous stream. A decode step multiplies a few rows by every weight once,
// so its matmuls are weight streams; XLA:CPU's dot kernels read a [K, N] weight at a third of the
// memory bandwidth for 16 rows, this kernel reads the packed one at ~60% of it (docs/benchmarks.md).
//
// Built at first use by spade_jax/kernels/__init__.py with the host compiler (-O3 -march=native)
// and registered as an XLA FFI custom call. GCC/Clang vector extensions keep it free of intrinsics.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kLanes = 16;       // columns per block
constexpr int64_t kPrefetch = 128;   // blocks rows ahead (8 KiB): hides DRAM latency
constexpr int64_t kChunk = 4;        // column blocks per unit of work shared between threads

// A block's 16 columns are kParts native vectors of kWidth floats. Rows per register tile: R x
// kParts accumulators plus the kParts weight vectors must fit the vector registers (AVX-512: 32 of
// 16 floats; AVX/AVX2: 16 of 8; NEON: 32 of 4; SSE: 16 of 4).
#if defined(__AVX512F__)
constexpr int kWidth = 16;
constexpr int64_t kRows = 16;
#elif defined(__AVX__)
constexpr int kWidth = 8;
constexpr int64_t kRows = 6;
#elif defined(__aarch64__)
constexpr int kWidth = 4;
constexpr int64_t kRows = 6;
#else
constexpr int kWidth = 4;
constexpr int64_t kRows = 3;
#endif
constexpr int kParts = kLanes / kWidth;
typedef float vec __attribute__((vector_size(kWidth * sizeof(float))));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <int R>
void tile(const float* x, const float* wb, float* y, int64_t K, int64_t N) {
  vec acc[R][kParts];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < kParts; ++p) acc[r][p] = vec{};
  for (int64_t k = 0; k < K; ++k) {
    vec w[kParts];
    for (int p = 0; p < kParts; ++p) w[p] = load(wb + k * kLanes + p * kWidth);
    __builtin_prefetch(wb + (k + kPrefetch) * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float xr = x[r * K + k];
      for (int p = 0; p < kParts; ++p) acc[r][p] += xr * w[p];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < kParts; ++p) std::memcpy(y + r * N + p * kWidth, &acc[r][p], sizeof(vec));
}

template <int R>
void tile_rows(int64_t rows, const float* x, const float* wb, float* y, int64_t K, int64_t N) {
  if constexpr (R > 0) {
    if (rows == R) return tile<R>(x, wb, y, K, N);
    return tile_rows<R - 1>(rows, x, wb, y, K, N);
  }
}

// Column blocks [b0, b1): every row of x against each block (the block stays in cache across
// the row tiles, so w is read from memory once).
void blocks(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t b0,
            int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const float* wb = w + b * K * kLanes;
    for (int64_t r = 0; r < M; r += kRows) {
      const int64_t rows = std::min(kRows, M - r);
      const float* xr = x + r * K;
      float* yr = y + r * N + b * kLanes;
      if (rows == kRows) {
        tile<kRows>(xr, wb, yr, K, N);
      } else {
        tile_rows<kRows - 1>(rows, xr, wb, yr, K, N);
      }
    }
  }
}

// Work shared by the calling thread and helpers on XLA's intra-op pool. Units are claimed from an
// atomic counter, so the caller finishes alone if no helper ever runs, and a helper that starts
// late (after the call returned) finds nothing to claim and touches no buffer.
struct Work {
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N, units, blocks_total;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};

  void run() {
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      const int64_t b0 = u * kChunk, b1 = std::min(blocks_total, b0 + kChunk);
      blocks(x, w, y, M, K, N, b0, b1);
      finished.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error PackedMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != kLanes)
    return ffi::Error::InvalidArgument("packed_matmul: x [M, K], w [N/16, K, 16], y [M, N]");
  const int64_t M = xd[0], K = xd[1], N = wd[0] * kLanes;
  if (wd[1] != K || yd[0] != M || yd[1] != N)
    return ffi::Error::InvalidArgument("packed_matmul: shapes do not agree");
  auto work = std::make_shared<Work>();
  work->x = x.typed_data();
  work->w = w.typed_data();
  work->y = y->typed_data();
  work->M = M, work->K = K, work->N = N;
  work->blocks_total = wd[0];
  work->units = (wd[0] + kChunk - 1) / kChunk;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), work->units) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->run(); });
  work->run();
  // Wait for the units helpers are still running: spin briefly (they end within microseconds on
  // an idle machine), then yield the core, which a helper may need on a loaded one.
  for (int spins = 0; work->finished.load(std::memory_order_acquire) < work->units; ++spins) {
    if (spins < 4096) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpadePackedMatmul, PackedMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

extern "C" int SpadePackedMatmulVectorBits() { return kWidth * 32; }
