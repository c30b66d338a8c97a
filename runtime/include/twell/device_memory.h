// Small host-side helpers over the lazily loaded CUDA driver, so host programs (twellc, tests,
// benchmarks, examples) need neither the CUDA runtime nor libcuda at link time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "twell/plan.h"

namespace twell {

class Context;

// Device memory owned by one object (cuMemAlloc / cuMemFree). Throws Error(NoDevice) without a GPU,
// Error(Cuda) when allocation fails (the message gives the size asked and the free memory).
class DeviceMemory {
 public:
  DeviceMemory(Context& context, size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // Copies and fill on the legacy default stream, complete when they return: work enqueued afterwards on
  // any stream sees them. They wait for the legacy stream's earlier work (and so for blocking streams'),
  // not for a non-blocking stream's (StreamHandle): synchronize a stream whose kernels still read or write
  // the buffer first. `offset + bytes` must lie inside the allocation (else Error(InvalidArgument)).
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill(uint8_t byte);  // poisons or clears the whole allocation

  template <class T>
  void upload(const std::vector<T>& v) { upload(v.data(), v.size() * sizeof(T)); }
  template <class T>
  std::vector<T> download_vector(size_t count) const {
    std::vector<T> v(count);
    download(v.data(), count * sizeof(T));
    return v;
  }

 private:
  uint64_t ptr_ = 0;
  size_t bytes_ = 0;
};

// A non-blocking CUDA stream (never the legacy default stream).
class StreamHandle {
 public:
  explicit StreamHandle(Context& context);
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  Stream get() const { return stream_; }
  void synchronize() const;

 private:
  Stream stream_ = nullptr;
};

// Times fn (which enqueues work on `stream`) with CUDA events: `warmup` untimed calls, then `reps`
// timed ones, each between its own pair of events, the stream held (a host function, at most 200 ms)
// until all are enqueued: the times are the GPU's, without the host's launch overhead between calls
// (what a CUDA-graph replay sees). Returns every time in milliseconds, sorted. Not during capture.
// before_each (optional) enqueues untimed work on `stream` before every call of fn, warm-up included,
// outside the events: FfnPlan's calibration fills L2 with other data with it, so weights come from DRAM as they do
// for a layer of a model whose weights exceed L2.
std::vector<double> time_on_stream(Stream stream, const std::function<void()>& fn, int warmup, int reps,
                                   const std::function<void()>& before_each = {});

// Times fn without the host's launch overhead: `calls` calls of fn (which must enqueue only
// capturable work on `stream`: no synchronization) are captured into one CUDA graph, which is launched
// once untimed and then `reps` times, each between its own pair of events. Returns the time per call
// (graph time / calls) in milliseconds, sorted. Where a few microseconds per call matter (decoding a
// token), the host's API calls would otherwise be timed beside the GPU's work. Throws
// Error(InvalidArgument) naming the argument for a null stream or calls/reps below 1, Error(Cuda)
// when the capture fails.
std::vector<double> time_graph_on_stream(Stream stream, const std::function<void()>& fn, int calls, int reps);

}  // namespace twell
