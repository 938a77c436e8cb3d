// Calibration of the copy paths: times DMA and the copy kernel on scratch buffers for each piece
// size and direction, and picks the size below which the kernel wins.
#include "transfer/calibrate.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include <kvoffload/error.hpp>

namespace kvoffload::detail {

namespace {

double measure(DeviceRuntime& rt, StreamView s, std::span<const CopyDescriptor> batch,
               CopyKind kind, CopyPath path, std::uint64_t bytes) {
  Event a = rt.create_event(true);
  Event b = rt.create_event(true);
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    rt.record_event(a.view(), s);
    rt.enqueue_copies(s, batch, kind, path);
    rt.record_event(b.view(), s);
    rt.synchronize_event(b.view());
    const double sec = rt.elapsed_seconds(a.view(), b.view());
    if (sec > 0) best = std::max(best, static_cast<double>(bytes) / sec / 1e9);
  }
  return best;
}

}  // namespace

void calibrate_paths(DeviceRuntime& rt, std::uint64_t calibration_bytes, CalibrationReport& report,
                     const std::function<void(Direction, std::uint64_t)>& apply) {
  const std::uint64_t kTotal = std::max<std::uint64_t>(calibration_bytes, 256ULL << 10);
  constexpr std::uint64_t kSizes[] = {4096, 8192, 16384, 32768, 65536, 131072, 262144};
  DeviceBuffer dev = rt.allocate_device(kTotal * 2);
  // Scratch host memory of our own, never the slots: calibration must not touch KV data.
  std::unique_ptr<void, decltype(&std::free)> host(std::aligned_alloc(4096, kTotal * 2),
                                                   &std::free);
  if (!host)
    throw Error(ErrorCode::kSystem, "calibrate: host scratch allocation failed", ENOMEM,
                "aligned_alloc");
  std::memset(host.get(), 0, kTotal * 2);
  HostRegistration reg = rt.register_host(host.get(), kTotal * 2);
  Stream s = rt.create_stream();
  std::vector<CopyDescriptor> dma;
  std::vector<CopyDescriptor> ker;
  for (Direction d : {Direction::kStore, Direction::kLoad}) {
    std::uint64_t threshold = 0;
    bool kernel_won_so_far = true;
    for (std::uint64_t size : kSizes) {
      const std::uint64_t count = kTotal / size;
      dma.clear();
      ker.clear();
      for (std::uint64_t i = 0; i < count; ++i) {
        // Every other piece, so neighbouring pieces are not contiguous (as scattered blocks).
        auto* dp = static_cast<std::byte*>(dev.data()) + 2 * i * size;
        auto* hp = static_cast<std::byte*>(host.get()) + 2 * i * size;
        auto* kp = static_cast<std::byte*>(reg.device_pointer(hp));
        if (d == Direction::kStore) {
          dma.push_back({dp, hp, size});
          ker.push_back({dp, kp, size});
        } else {
          dma.push_back({hp, dp, size});
          ker.push_back({kp, dp, size});
        }
      }
      const CopyKind kind =
          d == Direction::kStore ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice;
      CalibrationPoint p{d, size, count, measure(rt, s.view(), dma, kind, CopyPath::kDma, kTotal),
                         measure(rt, s.view(), ker, kind, CopyPath::kKernel, kTotal)};
      report.points.push_back(p);
      if (kernel_won_so_far && p.kernel_gbps > p.dma_gbps) {
        threshold = size * 2;  // kernel for pieces below the next size
      } else {
        kernel_won_so_far = false;
      }
    }
    apply(d, threshold);
  }
  // In stream order: a plain free (cudaFree) would wait for the whole device, model included.
  dev.release_async(s.view());
}

}  // namespace kvoffload::detail
