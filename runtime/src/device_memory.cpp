// twell/device_memory.h over the lazily loaded driver.
#include "twell/device_memory.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "context_impl.h"
#include "twell/error.h"

namespace twell {
namespace {
const detail::Driver& current(Context& c, const char* who) {
  auto impl = context_impl(c);
  if (!impl->gpu) throw Error(ErrorCode::NoDevice, fmt::format("{}: needs a GPU ({})", who, impl->no_gpu_reason));
  impl->make_current();
  return detail::Driver::get();
}
}  // namespace

DeviceMemory::DeviceMemory(Context& context, size_t bytes) : bytes_(bytes) {
  const detail::Driver& d = current(context, "DeviceMemory");
  CUdeviceptr p = 0;
  const CUresult r = d.cuMemAlloc(&p, std::max<size_t>(bytes, 1));
  if (r != CUDA_SUCCESS) {
    size_t free_bytes = 0, total = 0;
    d.cuMemGetInfo(&free_bytes, &total);
    detail::check(r, fmt::format("DeviceMemory: cuMemAlloc of {} bytes ({} bytes free)", bytes, free_bytes).c_str());
  }
  ptr_ = p;
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ != 0) detail::Driver::get().cuMemFree(static_cast<CUdeviceptr>(ptr_));
}

DeviceMemory::DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0; o.bytes_ = 0; }

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

void DeviceMemory::upload(const void* host, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("DeviceMemory::upload: [{}, {}) outside the {}-byte allocation", offset, offset + bytes, bytes_));
  if (bytes == 0) return;
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuMemcpyHtoD(ptr_ + offset, host, bytes), "DeviceMemory::upload: cuMemcpyHtoD");
  // From pageable memory the call may return before its DMA lands, and it is ordered on the legacy stream
  // only: a kernel on a non-blocking stream (StreamHandle) could read the old bytes.
  detail::check(d.cuStreamSynchronize(nullptr), "DeviceMemory::upload: cuStreamSynchronize");
}

void DeviceMemory::download(void* host, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("DeviceMemory::download: [{}, {}) outside the {}-byte allocation", offset, offset + bytes, bytes_));
  if (bytes) detail::check(detail::Driver::get().cuMemcpyDtoH(host, ptr_ + offset, bytes), "DeviceMemory::download: cuMemcpyDtoH");
}

void DeviceMemory::fill(uint8_t byte) {
  const detail::Driver& d = detail::Driver::get();
  detail::check(d.cuMemsetD8(ptr_, byte, bytes_), "DeviceMemory::fill: cuMemsetD8");
  // cuMemsetD8 is asynchronous on the legacy stream: without this wait a kernel on a non-blocking stream
  // could run while the memset still writes, and the poison land over its outputs (seen: a second
  // train_weight_grad call's dWd differed from the first's only where the late memset overwrote it).
  detail::check(d.cuStreamSynchronize(nullptr), "DeviceMemory::fill: cuStreamSynchronize");
}

StreamHandle::StreamHandle(Context& context) {
  CUstream s = nullptr;
  detail::check(current(context, "StreamHandle").cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  stream_ = reinterpret_cast<Stream>(s);
}

StreamHandle::~StreamHandle() {
  if (stream_ != nullptr) detail::Driver::get().cuStreamDestroy(reinterpret_cast<CUstream>(stream_));
}

void StreamHandle::synchronize() const {
  detail::check(detail::Driver::get().cuStreamSynchronize(reinterpret_cast<CUstream>(stream_)), "cuStreamSynchronize");
}

namespace {
// Holds a stream until the host has enqueued the timed calls (cuLaunchHostFunc: the stream waits for
// the host function, which waits for open), so that the events time the GPU's work back to back and
// not the host's API calls between them, as a CUDA-graph replay would. The wait is bounded: should
// the host block while enqueueing (a full launch queue), the stream goes on after 200 ms and the
// times then include host time, as without the hold.
struct StreamHold {
  std::atomic<bool> open{false};
  static void CUDA_CB wait(void* self) {
    auto* hold = static_cast<StreamHold*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (!hold->open.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }
};
}  // namespace

std::vector<double> time_on_stream(Stream stream, const std::function<void()>& fn, int warmup, int reps,
                                   const std::function<void()>& before_each) {
  const detail::Driver& d = detail::Driver::get();
  auto s = reinterpret_cast<CUstream>(stream);
  for (int i = 0; i < warmup; ++i) {
    if (before_each) before_each();
    fn();
  }
  std::vector<CUevent> events(2 * static_cast<size_t>(reps));
  for (auto& e : events) detail::check(d.cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
  StreamHold hold;  // outlives the synchronization below, which waits for its host function
  try {
    detail::check(d.cuLaunchHostFunc(s, &StreamHold::wait, &hold), "time_on_stream: cuLaunchHostFunc");
    for (int i = 0; i < reps; ++i) {
      if (before_each) before_each();
      detail::check(d.cuEventRecord(events[2 * i], s), "cuEventRecord");
      fn();
      detail::check(d.cuEventRecord(events[2 * i + 1], s), "cuEventRecord");
    }
  } catch (...) {
    hold.open.store(true, std::memory_order_release);
    d.cuStreamSynchronize(s);  // the host function must finish before `hold` goes
    for (auto& e : events) d.cuEventDestroy(e);
    throw;
  }
  hold.open.store(true, std::memory_order_release);
  detail::check(d.cuStreamSynchronize(s), "cuStreamSynchronize");
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    detail::check(d.cuEventElapsedTime(&t, events[2 * i], events[2 * i + 1]), "cuEventElapsedTime");
    ms[i] = t;
  }
  for (auto& e : events) d.cuEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms;
}

std::vector<double> time_graph_on_stream(Stream stream, const std::function<void()>& fn, int calls, int reps) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::InvalidArgument, "time_graph_on_stream: " + m); };
  if (stream == nullptr) bad("stream: expected a created stream (the legacy default stream cannot be captured), got nullptr");
  if (calls < 1) bad(fmt::format("calls: expected at least 1, got {}", calls));
  if (reps < 1) bad(fmt::format("reps: expected at least 1, got {}", reps));
  const detail::Driver& d = detail::Driver::get();
  auto s = reinterpret_cast<CUstream>(stream);
  CUgraph graph = nullptr;
  detail::check(d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  try {
    for (int i = 0; i < calls; ++i) fn();
  } catch (...) {
    d.cuStreamEndCapture(s, &graph);  // leave the stream usable
    if (graph != nullptr) d.cuGraphDestroy(graph);
    throw;
  }
  detail::check(d.cuStreamEndCapture(s, &graph),
                "time_graph_on_stream: cuStreamEndCapture (fn did something a capture cannot hold, e.g. a synchronization: "
                "a Dispatch::Auto plan's first run of a token bucket)");
  CUgraphExec exec = nullptr;
  const CUresult r = d.cuGraphInstantiateWithFlags(&exec, graph, 0);
  d.cuGraphDestroy(graph);
  detail::check(r, "cuGraphInstantiateWithFlags");
  std::vector<double> ms;
  try {
    ms = time_on_stream(stream, [&] { detail::check(d.cuGraphLaunch(exec, s), "cuGraphLaunch"); }, 1, reps);
  } catch (...) {
    d.cuGraphExecDestroy(exec);
    throw;
  }
  d.cuGraphExecDestroy(exec);
  for (double& t : ms) t /= calls;
  return ms;
}

}  // namespace twell
