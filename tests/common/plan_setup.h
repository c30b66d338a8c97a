// The set-up of the unit tests that make plans with or without a GPU: a Context that keeps its kernels
// in memory (no disk cache) and the small FFN shape they plan. Without a GPU, plans are generated and
// compiled, and every launch says why it cannot.
#pragma once
#include "twell/context.h"
#include "twell/spec.h"

namespace twell::testing {

// The default device (a GPU where one is present, else none) with the disk cache off: a test neither
// reads nor fills the user's kernel cache.
inline Context context_without_disk_cache() {
  ContextOptions o;
  o.disk_cache = false;
  return Context(o);
}

// One process-wide context without a device (ContextOptions::kNoDevice) and without the disk cache:
// kernels are generated and compiled, every launch and allocation says there is no GPU, whether or not
// the machine has one (the argument checks that run before the device is needed).
inline Context& no_device_context() {
  static Context ctx([] {
    ContextOptions o;
    o.device = ContextOptions::kNoDevice;
    o.disk_cache = false;
    return o;
  }());
  return ctx;
}

// A spec of this shape, the other fields the defaults.
inline FfnSpec ffn_spec(int64_t d_model, int64_t d_ff) {
  FfnSpec s;
  s.d_model = d_model;
  s.d_ff = d_ff;
  return s;
}

// d_model 512, d_ff 1408 (5.5 tiles of 256): quick to generate and compile.
inline FfnSpec spec_512x1408() { return ffn_spec(512, 1408); }

}  // namespace twell::testing
