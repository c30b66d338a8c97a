// The C API (twell/c_api.h): each function converts its C structs to the C++ API's types, calls it,
// and turns every exception into a status code and the thread's last-error message.
#include "twell/c_api.h"

#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "twell/context.h"
#include "twell/dense.h"
#include "twell/error.h"
#include "twell/jit_registry.h"
#include "twell/kernels/validate.h"
#include "twell/neuron_order.h"
#include "twell/layer_data.h"
#include "twell/plan.h"
#include "twell/safetensors.h"
#include "twell/training_plan.h"
#include "twell/tuning.h"

#ifndef TWELL_VERSION
#define TWELL_VERSION "unknown"
#endif

struct twell_context {
  twell::Context context;
  std::string target, device_name, no_gpu_reason;
};

struct twell_plan {
  twell::FfnPlan plan;
  std::string last_path, json;
};

struct twell_dense {
  twell::DenseFfn dense;
};

struct twell_training_plan {
  twell::FfnTrainingPlan plan;
  std::string json;
};

struct twell_training_state {
  twell::FfnTrainingState state;
};

namespace {

thread_local std::string last_error;

using twell::Error;
using twell::ErrorCode;

twell_status_t status_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return TWELL_ERROR_INVALID_ARGUMENT;
    case ErrorCode::NotFound: return TWELL_ERROR_NOT_FOUND;
    case ErrorCode::Io: return TWELL_ERROR_IO;
    case ErrorCode::Parse: return TWELL_ERROR_PARSE;
    case ErrorCode::Compile: return TWELL_ERROR_COMPILE;
    case ErrorCode::Cuda: return TWELL_ERROR_CUDA;
    case ErrorCode::NoDevice: return TWELL_ERROR_NO_DEVICE;
    case ErrorCode::Unsupported: return TWELL_ERROR_UNSUPPORTED;
  }
  return TWELL_ERROR_INTERNAL;
}

// Runs `body`, mapping what it throws; nothing escapes into C.
template <typename Body>
twell_status_t guarded(Body&& body) {
  try {
    body();
    last_error.clear();
    return TWELL_SUCCESS;
  } catch (const Error& e) {
    last_error = e.what();
    return status_of(e.code());
  } catch (const std::bad_alloc&) {
    last_error = "out of host memory";
    return TWELL_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error = std::string("internal error: ") + e.what();
    return TWELL_ERROR_INTERNAL;
  } catch (...) {
    last_error = "internal error: an unknown exception";
    return TWELL_ERROR_INTERNAL;
  }
}

void invalid(const char* function, const char* argument, const std::string& expected, const std::string& got) {
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}: expected {}, got {}", function, argument, expected, got));
}

template <typename T>
T& require(T* handle, const char* function, const char* argument) {
  if (handle == nullptr) invalid(function, argument, "a handle", "NULL");
  return *handle;
}

void require_out(const void* out, const char* function, const char* argument) {
  if (out == nullptr) invalid(function, argument, "a pointer to write the result to", "NULL");
}

template <typename Struct>
void require_struct(const Struct* s, const char* function, const char* argument) {
  if (s == nullptr) invalid(function, argument, "a pointer to a struct filled by its _init function", "NULL");
  if (s->struct_size != sizeof(Struct))
    invalid(function, fmt::format("{}->struct_size", argument).c_str(),
            fmt::format("{} (this library's size; call the _init function first)", sizeof(Struct)),
            std::to_string(s->struct_size));
}

template <typename Enum>
Enum enum_value(int value, int first, int last, const char* function, const char* field) {
  if (value < first || value > last)
    invalid(function, field, fmt::format("a value in {}..{}", first, last), std::to_string(value));
  return static_cast<Enum>(value);
}

twell::FfnSpec to_spec(const twell_ffn_spec* s, const char* function) {
  require_struct(s, function, "spec");
  twell::FfnSpec spec;
  spec.d_model = s->d_model;
  spec.d_ff = s->d_ff;
  spec.gated = s->gated != 0;
  spec.activation = enum_value<twell::Activation>(s->activation, 0, 1, function, "spec->activation");
  spec.threshold = s->threshold;
  spec.dtype = enum_value<twell::DType>(s->dtype, 0, 1, function, "spec->dtype");
  spec.down_layout = enum_value<twell::WeightLayout>(s->down_layout, 0, 1, function, "spec->down_layout");
  if (s->tile_n != 0) spec.tile_n = s->tile_n;
  if (s->slots != 0) spec.slots = s->slots;
  if (s->consumer != TWELL_CONSUMER_DEFAULT)
    spec.consumer = enum_value<twell::ConsumerVariant>(s->consumer, 0, 1, function, "spec->consumer");
  if (s->gate_cluster_m != 0) spec.gate_cluster_m = s->gate_cluster_m;
  return spec;
}

twell::FfnTensors to_tensors(const twell_ffn_tensors* t, const char* function) {
  if (t == nullptr) invalid(function, "tensors", "a pointer to a twell_ffn_tensors", "NULL");
  return twell::FfnTensors{t->x, t->w_gate, t->w_up, t->w_down, t->y, t->ld_x, t->ld_gate, t->ld_up, t->ld_down, t->ld_y};
}

twell::Stream to_stream(void* stream) { return static_cast<twell::Stream>(stream); }

nlohmann::json kernels_json(const std::vector<twell::KernelReport>& reports) {
  nlohmann::json kernels = nlohmann::json::array();
  for (const twell::KernelReport& k : reports)
    kernels.push_back({{"name", k.name}, {"kind", k.kind}, {"cache", k.cache}, {"compile_ms", k.compile_ms},
                       {"load_ms", k.load_ms}, {"ptx_bytes", k.ptx_bytes}, {"cubin_bytes", k.cubin_bytes},
                       {"arch", k.arch}, {"consumer", k.consumer}, {"threads", k.threads}, {"cta_m", k.cta_m},
                       {"grid_y", k.grid_y}, {"tiles", k.tiles}, {"persistent", k.persistent},
                       {"cluster_m", k.cluster_m}});
  return kernels;
}

nlohmann::json spec_json(const twell::FfnSpec& s) {
  return {{"d_model", s.d_model}, {"d_ff", s.d_ff}, {"gated", s.gated}, {"activation", to_string(s.activation)},
          {"threshold", s.threshold}, {"dtype", to_string(s.dtype)}, {"down_layout", to_string(s.down_layout)}};
}

nlohmann::json layout_json(const twell::TwellLayout& l) {
  return {{"tile_n", l.tile_n}, {"slots", l.slots}, {"index_bits", l.index_bits}};
}

nlohmann::json describe(const twell::FfnPlan& plan) {
  return {{"spec", spec_json(plan.spec())},
          {"layout", layout_json(plan.layout())},
          {"target", plan.target().arch()},
          {"max_tokens", plan.max_tokens()},
          {"dense_neurons", plan.dense_neurons()},
          {"runnable", plan.runnable()},
          {"config_source", plan.config_source()},
          {"kernels", kernels_json(plan.kernels())}};
}

const char* dispatch_name(twell::TrainingDispatch d) {
  return d == twell::TrainingDispatch::Dense ? "dense" : d == twell::TrainingDispatch::Auto ? "auto" : "sparse";
}

nlohmann::json decisions_json(const std::vector<twell::TrainingDecision>& decisions) {
  nlohmann::json out = nlohmann::json::array();
  for (const twell::TrainingDecision& d : decisions)
    out.push_back({{"decision_key", d.decision_key}, {"max_tokens", d.max_tokens},
                   {"path", d.path == twell::TrainingPath::Dense ? "dense" : "sparse"}, {"sparse_ms", d.sparse_ms},
                   {"dense_ms", d.dense_ms}, {"sparse_steps", d.sparse_steps}, {"dense_steps", d.dense_steps}});
  return out;
}

}  // namespace

extern "C" {

int twell_c_api_version(void) { return TWELL_C_API_VERSION; }
const char* twell_version(void) { return TWELL_VERSION; }
const char* twell_last_error(void) { return last_error.c_str(); }
int twell_jit_available(void) { return twell::registered_kernel_compiler() != nullptr ? 1 : 0; }

const char* twell_status_string(twell_status_t status) {
  switch (status) {
    case TWELL_SUCCESS: return "TWELL_SUCCESS";
    case TWELL_ERROR_INVALID_ARGUMENT: return "TWELL_ERROR_INVALID_ARGUMENT";
    case TWELL_ERROR_NOT_FOUND: return "TWELL_ERROR_NOT_FOUND";
    case TWELL_ERROR_IO: return "TWELL_ERROR_IO";
    case TWELL_ERROR_PARSE: return "TWELL_ERROR_PARSE";
    case TWELL_ERROR_COMPILE: return "TWELL_ERROR_COMPILE";
    case TWELL_ERROR_CUDA: return "TWELL_ERROR_CUDA";
    case TWELL_ERROR_NO_DEVICE: return "TWELL_ERROR_NO_DEVICE";
    case TWELL_ERROR_UNSUPPORTED: return "TWELL_ERROR_UNSUPPORTED";
    case TWELL_ERROR_OUT_OF_MEMORY: return "TWELL_ERROR_OUT_OF_MEMORY";
    case TWELL_ERROR_INTERNAL: return "TWELL_ERROR_INTERNAL";
  }
  return "TWELL_ERROR_UNKNOWN_STATUS";
}

void twell_context_options_init(twell_context_options* o) {
  if (o == nullptr) return;
  *o = twell_context_options{};
  o->struct_size = sizeof(twell_context_options);
  o->device = 0;
  o->disk_cache = 1;
  o->jit = TWELL_JIT_IF_LINKED;
}

void twell_ffn_spec_init(twell_ffn_spec* s) {
  if (s == nullptr) return;
  *s = twell_ffn_spec{};
  s->struct_size = sizeof(twell_ffn_spec);
  s->gated = 1;
  s->activation = TWELL_RELU;
  s->dtype = TWELL_BF16;
  s->down_layout = TWELL_OUT_IN;
  s->consumer = TWELL_CONSUMER_DEFAULT;
}

void twell_plan_options_init(twell_plan_options* o) {
  if (o == nullptr) return;
  *o = twell_plan_options{};
  o->struct_size = sizeof(twell_plan_options);
  const twell::PlanOptions defaults;
  o->backup_capacity = -1;
  o->dispatch = TWELL_DISPATCH_AUTO;
  o->dense_neurons = defaults.dense_neurons;
  o->decode_max_tokens = defaults.decode_max_tokens;
  o->use_tuning = 1;
  o->decode_fused_max_tokens = defaults.decode_fused_max_tokens;
}

twell_status_t twell_context_create(const twell_context_options* options, twell_context_t* context) {
  return guarded([&] {
    constexpr const char* fn = "twell_context_create";
    require_out(context, fn, "context");
    twell_context_options defaults;
    twell_context_options_init(&defaults);
    if (options == nullptr) options = &defaults;
    require_struct(options, fn, "options");
    twell::ContextOptions o;
    o.device = options->device;
    if (options->cache_dir != nullptr) o.cache_dir = options->cache_dir;
    o.disk_cache = options->disk_cache != 0;
    if (options->target_sm != 0) o.target = twell::Target{options->target_sm, options->target_arch_specific != 0};
    if (options->num_bundles > 0 && options->bundles == nullptr)
      invalid(fn, "options->bundles", fmt::format("{} directory names", options->num_bundles), "NULL");
    for (size_t i = 0; i < options->num_bundles; ++i) {
      if (options->bundles[i] == nullptr) invalid(fn, fmt::format("options->bundles[{}]", i).c_str(), "a directory name", "NULL");
      o.bundles.emplace_back(options->bundles[i]);
    }
    o.jit = enum_value<twell::ContextOptions::Jit>(options->jit, 0, 1, fn, "options->jit");
    auto* c = new twell_context{twell::Context(std::move(o)), {}, {}, {}};
    c->target = c->context.target().arch();
    c->device_name = c->context.device_name();
    c->no_gpu_reason = c->context.no_gpu_reason();
    *context = c;
  });
}

twell_status_t twell_context_destroy(twell_context_t context) {
  return guarded([&] { delete context; });
}

twell_status_t twell_context_info(twell_context_t context, int* has_gpu, int* sm_count, const char** target,
                                  const char** device_name, const char** no_gpu_reason) {
  return guarded([&] {
    twell_context& c = require(context, "twell_context_info", "context");
    if (has_gpu) *has_gpu = c.context.has_gpu() ? 1 : 0;
    if (sm_count) *sm_count = c.context.sm_count();
    if (target) *target = c.target.c_str();
    if (device_name) *device_name = c.device_name.c_str();
    if (no_gpu_reason) *no_gpu_reason = c.no_gpu_reason.c_str();
  });
}

twell_status_t twell_context_load_bundle(twell_context_t context, const char* dir) {
  return guarded([&] {
    twell_context& c = require(context, "twell_context_load_bundle", "context");
    if (dir == nullptr) invalid("twell_context_load_bundle", "dir", "a directory name", "NULL");
    c.context.load_bundle(dir);
  });
}

twell_status_t twell_context_tune(twell_context_t context, const twell_ffn_spec* spec, const char* request_json,
                                  const char** result_json) {
  return guarded([&] {
    constexpr const char* fn = "twell_context_tune";
    twell_context& c = require(context, fn, "context");
    require_out(result_json, fn, "result_json");
    twell::TuneRequest r;
    r.spec = to_spec(spec, fn);
    const nlohmann::json q = request_json ? nlohmann::json::parse(request_json, nullptr, /*allow_exceptions=*/false) : nlohmann::json::object();
    if (!q.is_object()) invalid(fn, "request_json", "a JSON object", request_json ? std::string(request_json).substr(0, 200) : "");
    // Strict types: no float truncated to a count, no bool read as a number, no out-of-range cast.
    auto integer = [&](const nlohmann::json& v, const char* key, int64_t lo, int64_t hi) {
      if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi ||
          (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)))
        invalid(fn, "request_json", fmt::format("\"{}\": an integer in {}..{}", key, lo, hi), v.dump().substr(0, 100));
      return v.get<int64_t>();
    };
    auto number = [&](const nlohmann::json& v, const char* key) {
      if (!v.is_number()) invalid(fn, "request_json", fmt::format("\"{}\": a number", key), v.dump().substr(0, 100));
      return v.get<double>();
    };
    for (const auto& [key, value] : q.items()) {
      if (key == "tokens") {
        if (!value.is_array()) invalid(fn, "request_json", "\"tokens\": an array of integers", value.dump().substr(0, 100));
        r.tokens.clear();
        for (const auto& t : value) r.tokens.push_back(integer(t, "tokens", 1, int64_t{1} << 24));
      } else if (key == "density") {
        r.density = number(value, "density");
      } else if (key == "budget_s") {
        r.budget_s = number(value, "budget_s");
      } else if (key == "reps") {
        r.reps = static_cast<int>(integer(value, "reps", 1, 1000));
      } else if (key == "write") {
        if (!value.is_boolean()) invalid(fn, "request_json", "\"write\": true or false", value.dump().substr(0, 100));
        r.write = value.get<bool>();
      } else if (key == "database") {
        if (!value.is_string()) invalid(fn, "request_json", "\"database\": a directory name", value.dump().substr(0, 100));
        r.database = value.get<std::string>();
      } else if (key != "weights" && key != "layer") {
        invalid(fn, "request_json", "keys tokens, density, weights, layer, budget_s, reps, write, database",
                "key " + nlohmann::json(key).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace).substr(0, 100));
      }
    }
    if (q.contains("layer") && !q.contains("weights")) invalid(fn, "request_json", "\"layer\" with \"weights\"", "\"layer\" alone");
    if (q.contains("density") && q.contains("weights"))
      invalid(fn, "request_json", "\"density\" (random inputs) or \"weights\" (a real layer)", "both");
    if (q.contains("weights")) {
      const auto& w = q["weights"];
      if (!w.is_array() || w.empty()) invalid(fn, "request_json", "\"weights\": a non-empty array of paths", w.dump().substr(0, 100));
      std::vector<twell::SafeTensors> files;
      for (const auto& f : w) {
        if (!f.is_string()) invalid(fn, "request_json", "\"weights\": paths (strings)", f.dump().substr(0, 100));
        files.push_back(twell::SafeTensors::read(f.get<std::string>()));
      }
      std::optional<int> layer;
      if (q.contains("layer")) layer = static_cast<int>(integer(q["layer"], "layer", 0, 1 << 30));
      r.layer = twell::load_layer(files, layer, /*random_up_down_if_missing=*/true);
    }
    const twell::TuneResult t = c.context.tune(r);
    // Per thread: concurrent tunes on one context (contexts are shared by threads) each keep theirs.
    thread_local std::string tune_json;
    tune_json = twell::tune_result_json(t);
    *result_json = tune_json.c_str();
  });
}

twell_status_t twell_plan_create(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                 const twell_plan_options* options, twell_plan_t* plan) {
  return guarded([&] {
    constexpr const char* fn = "twell_plan_create";
    twell_context& c = require(context, fn, "context");
    require_out(plan, fn, "plan");
    const twell::FfnSpec s = to_spec(spec, fn);
    twell_plan_options defaults;
    twell_plan_options_init(&defaults);
    if (options == nullptr) options = &defaults;
    require_struct(options, fn, "options");
    twell::PlanOptions o;
    if (options->backup_capacity != -1) {
      if (options->backup_capacity < 0 || options->backup_capacity > int64_t{UINT32_MAX})
        invalid(fn, "options->backup_capacity", "-1 (the default) or 0..4294967295 tile-rows",
                std::to_string(options->backup_capacity));
      o.backup_capacity = static_cast<uint32_t>(options->backup_capacity);
    }
    o.dispatch = enum_value<twell::Dispatch>(options->dispatch, 0, 2, fn, "options->dispatch");
    o.dense_neurons = options->dense_neurons;
    o.decode_max_tokens = options->decode_max_tokens;
    o.decode_fused_max_tokens = options->decode_fused_max_tokens;
    o.tuning = options->use_tuning ? twell::PlanOptions::Tuning::Use : twell::PlanOptions::Tuning::Ignore;
    if (options->tuning_workload != nullptr) o.tuning_workload = options->tuning_workload;
    if (options->tuning_dir != nullptr) o.tuning_dir = options->tuning_dir;
    *plan = new twell_plan{c.context.plan(s, max_tokens, o), {}, {}};
  });
}

twell_status_t twell_plan_destroy(twell_plan_t plan) {
  return guarded([&] { delete plan; });
}

twell_status_t twell_plan_run(twell_plan_t plan, void* stream, const twell_ffn_tensors* tensors, int64_t tokens,
                              uint64_t decision_key) {
  return guarded([&] {
    twell_plan& p = require(plan, "twell_plan_run", "plan");
    p.plan.run(to_stream(stream), to_tensors(tensors, "twell_plan_run"), tokens, decision_key);
  });
}

twell_status_t twell_plan_max_tokens(twell_plan_t plan, int64_t* max_tokens) {
  return guarded([&] {
    twell_plan& p = require(plan, "twell_plan_max_tokens", "plan");
    require_out(max_tokens, "twell_plan_max_tokens", "max_tokens");
    *max_tokens = p.plan.max_tokens();
  });
}

twell_status_t twell_plan_last_path(twell_plan_t plan, const char** path) {
  return guarded([&] {
    twell_plan& p = require(plan, "twell_plan_last_path", "plan");
    require_out(path, "twell_plan_last_path", "path");
    p.last_path = p.plan.last_path();
    *path = p.last_path.c_str();
  });
}

twell_status_t twell_plan_recalibrate(twell_plan_t plan) {
  return guarded([&] { require(plan, "twell_plan_recalibrate", "plan").plan.recalibrate(); });
}

twell_status_t twell_plan_describe(twell_plan_t plan, const char** json) {
  return guarded([&] {
    twell_plan& p = require(plan, "twell_plan_describe", "plan");
    require_out(json, "twell_plan_describe", "json");
    p.json = describe(p.plan).dump();
    *json = p.json.c_str();
  });
}

twell_status_t twell_plan_last_overflow(twell_plan_t plan, void* stream, twell_overflow_report* report) {
  return guarded([&] {
    twell_plan& p = require(plan, "twell_plan_last_overflow", "plan");
    require_out(report, "twell_plan_last_overflow", "report");
    const twell::OverflowReport r = p.plan.last_overflow(to_stream(stream));
    *report = twell_overflow_report{r.overflowing_tile_rows, r.backup_capacity, r.recomputed ? 1 : 0};
  });
}

twell_status_t twell_plan_neuron_activity(twell_plan_t plan, void* stream, uint64_t* activity, int64_t count,
                                          int64_t* rows) {
  return guarded([&] {
    constexpr const char* fn = "twell_plan_neuron_activity";
    twell_plan& p = require(plan, fn, "plan");
    require_out(activity, fn, "activity");
    require_out(rows, fn, "rows");
    const int64_t neurons = p.plan.spec().d_ff - p.plan.dense_neurons();
    if (count != neurons)
      invalid(fn, "count", fmt::format("{} (the plan's TwELL neurons: d_ff - dense_neurons)", neurons), std::to_string(count));
    const twell::TwellMatrix m = p.plan.download_twell(to_stream(stream));
    const std::vector<uint64_t> a = twell::neuron_activity(m);
    std::memcpy(activity, a.data(), a.size() * sizeof(uint64_t));
    *rows = m.rows;
  });
}

extern "C++" namespace {
// Both choosers' C form: the spec and the counts checked, then `choose` (the inference or training model).
template <class Choose>
twell_status_t choose_split(const char* fn, const twell_ffn_spec* spec, int64_t tokens, const uint64_t* sorted_activity,
                            int64_t count, int64_t rows, int64_t* dense_neurons, Choose&& choose) {
  return guarded([&] {
    const twell::FfnSpec s = to_spec(spec, fn);
    if (const std::string why = twell::kernels::validate_spec(s, "spec->"); !why.empty())
      throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", fn, why));
    require_out(dense_neurons, fn, "dense_neurons");
    if (count < 0) invalid(fn, "count", "a non-negative number of counts", std::to_string(count));
    if (count > 0 && sorted_activity == nullptr) invalid(fn, "sorted_activity", fmt::format("{} counts", count), "NULL");
    *dense_neurons = choose(s, tokens, std::span<const uint64_t>{sorted_activity, static_cast<size_t>(count)}, rows);
  });
}
}  // namespace

twell_status_t twell_choose_dense_neurons(const twell_ffn_spec* spec, int64_t tokens, const uint64_t* sorted_activity,
                                          int64_t count, int64_t rows, int64_t* dense_neurons) {
  return choose_split("twell_choose_dense_neurons", spec, tokens, sorted_activity, count, rows, dense_neurons,
                      [](const auto&... a) { return twell::choose_dense_neurons(a...); });
}

twell_status_t twell_choose_training_dense_neurons(const twell_ffn_spec* spec, int64_t tokens, const uint64_t* sorted_activity,
                                                   int64_t count, int64_t rows, int64_t* dense_neurons) {
  return choose_split("twell_choose_training_dense_neurons", spec, tokens, sorted_activity, count, rows, dense_neurons,
                      [](const auto&... a) { return twell::choose_training_dense_neurons(a...); });
}

twell_status_t twell_dense_create(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                  twell_dense_kernels_t kernels, twell_dense_t* dense) {
  return guarded([&] {
    constexpr const char* fn = "twell_dense_create";
    twell_context& c = require(context, fn, "context");
    require_out(dense, fn, "dense");
    const twell::FfnSpec s = to_spec(spec, fn);
    const auto k = enum_value<twell::DenseKernels>(kernels, 0, 3, fn, "kernels");
    *dense = new twell_dense{twell::DenseFfn(c.context, s, max_tokens, k)};
  });
}

twell_status_t twell_dense_destroy(twell_dense_t dense) {
  return guarded([&] { delete dense; });
}

twell_status_t twell_dense_run(twell_dense_t dense, void* stream, const twell_ffn_tensors* tensors, int64_t tokens) {
  return guarded([&] {
    twell_dense& d = require(dense, "twell_dense_run", "dense");
    d.dense.run(to_stream(stream), to_tensors(tensors, "twell_dense_run"), tokens);
  });
}

namespace {
twell_status_t training_plan_create(const char* fn, twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                    int64_t backup_capacity, int flags, int64_t dense_neurons, twell_training_plan_t* plan) {
  return guarded([&] {
    twell_context& c = require(context, fn, "context");
    require_out(plan, fn, "plan");
    const twell::FfnSpec s = to_spec(spec, fn);
    twell::TrainingPlanOptions o;
    if (backup_capacity != -1) {
      if (backup_capacity < 0 || backup_capacity > int64_t{UINT32_MAX})
        invalid(fn, "backup_capacity", "-1 (the default) or 0..4294967295 tile-rows", std::to_string(backup_capacity));
      o.backup_capacity = static_cast<uint32_t>(backup_capacity);
    }
    constexpr int dispatch_flags = TWELL_TRAINING_DISPATCH_DENSE | TWELL_TRAINING_DISPATCH_AUTO;
    if ((flags & ~(TWELL_TRAINING_GRADIENTS_IN_DTYPE | TWELL_TRAINING_RECOMPUTE_U | TWELL_TRAINING_DW_DOWN_AS_WEIGHT |
                   dispatch_flags)) != 0 ||
        (flags & dispatch_flags) == dispatch_flags)
      invalid(fn, "flags", "0 or a bitwise or of TWELL_TRAINING_GRADIENTS_IN_DTYPE (1), TWELL_TRAINING_RECOMPUTE_U (2), "
              "TWELL_TRAINING_DW_DOWN_AS_WEIGHT (4) and at most one of TWELL_TRAINING_DISPATCH_DENSE (8) and "
              "TWELL_TRAINING_DISPATCH_AUTO (16)",
              std::to_string(flags));
    o.dispatch = (flags & TWELL_TRAINING_DISPATCH_DENSE) ? twell::TrainingDispatch::Dense
                 : (flags & TWELL_TRAINING_DISPATCH_AUTO) ? twell::TrainingDispatch::Auto
                                                          : twell::TrainingDispatch::Sparse;
    o.gradients_in_dtype = (flags & TWELL_TRAINING_GRADIENTS_IN_DTYPE) != 0;
    o.keep_u = (flags & TWELL_TRAINING_RECOMPUTE_U) == 0;
    o.dw_down_as_weight = (flags & TWELL_TRAINING_DW_DOWN_AS_WEIGHT) != 0;
    o.dense_neurons = dense_neurons;  // (checked by create, named options.dense_neurons)
    *plan = new twell_training_plan{twell::FfnTrainingPlan::create(c.context, s, max_tokens, o), {}};
  });
}
}  // namespace

twell_status_t twell_training_plan_create(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                          int64_t backup_capacity, int flags, twell_training_plan_t* plan) {
  return training_plan_create("twell_training_plan_create", context, spec, max_tokens, backup_capacity, flags, 0, plan);
}

twell_status_t twell_training_plan_create_split(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                                int64_t backup_capacity, int flags, int64_t dense_neurons,
                                                twell_training_plan_t* plan) {
  return training_plan_create("twell_training_plan_create_split", context, spec, max_tokens, backup_capacity, flags,
                              dense_neurons, plan);
}

twell_status_t twell_training_plan_destroy(twell_training_plan_t plan) {
  return guarded([&] { delete plan; });
}

twell_status_t twell_training_plan_describe(twell_training_plan_t plan, const char** json) {
  return guarded([&] {
    twell_training_plan& p = require(plan, "twell_training_plan_describe", "plan");
    require_out(json, "twell_training_plan_describe", "json");
    p.json = nlohmann::json{{"spec", spec_json(p.plan.spec())},
                            {"layout", layout_json(p.plan.layout())},
                            {"max_tokens", p.plan.max_tokens()},
                            {"runnable", p.plan.runnable()},
                            {"state_bytes_per_row", p.plan.state_bytes(1, 0) - p.plan.state_bytes(0, 0)},
                            {"gradients_in_dtype", p.plan.options().gradients_in_dtype},
                            {"keep_u", p.plan.options().keep_u},
                            {"dw_down_as_weight", p.plan.options().dw_down_as_weight},
                            {"dense_neurons", p.plan.options().dense_neurons},
                            {"dispatch", dispatch_name(p.plan.options().dispatch)},
                            {"dense_state_bytes_per_row", p.plan.dense_state_bytes(1)},
                            {"decisions", decisions_json(p.plan.decisions())},
                            {"kernels", kernels_json(p.plan.kernels())}}
                 .dump();
    *json = p.json.c_str();
  });
}

twell_status_t twell_training_plan_recalibrate(twell_training_plan_t plan) {
  return guarded([&] { require(plan, "twell_training_plan_recalibrate", "plan").plan.recalibrate(); });
}

twell_status_t twell_training_state_create(twell_training_plan_t plan, twell_training_state_t* state) {
  return guarded([&] {
    twell_training_plan& p = require(plan, "twell_training_state_create", "plan");
    require_out(state, "twell_training_state_create", "state");
    *state = new twell_training_state{p.plan.make_state()};
  });
}

twell_status_t twell_training_state_destroy(twell_training_state_t state) {
  return guarded([&] { delete state; });
}

twell_status_t twell_training_forward(twell_training_plan_t plan, void* stream, const twell_ffn_tensors* tensors,
                                      int64_t tokens, twell_training_state_t state, float* row_l1) {
  return guarded([&] {
    constexpr const char* fn = "twell_training_forward";
    twell_training_plan& p = require(plan, fn, "plan");
    twell_training_state& s = require(state, fn, "state");
    p.plan.forward(to_stream(stream), to_tensors(tensors, fn), tokens, s.state, row_l1);
  });
}

twell_status_t twell_training_forward_keyed(twell_training_plan_t plan, void* stream, const twell_ffn_tensors* tensors,
                                            int64_t tokens, twell_training_state_t state, float* row_l1,
                                            uint64_t decision_key) {
  return guarded([&] {
    constexpr const char* fn = "twell_training_forward_keyed";
    twell_training_plan& p = require(plan, fn, "plan");
    twell_training_state& s = require(state, fn, "state");
    p.plan.forward(to_stream(stream), to_tensors(tensors, fn), tokens, s.state, row_l1, decision_key);
  });
}

twell_status_t twell_training_backward(twell_training_plan_t plan, void* stream, const twell_ffn_tensors* tensors,
                                       const void* dy, int64_t ld_dy, int64_t tokens, twell_training_state_t state,
                                       const twell_ffn_gradients* gradients, float lambda, int64_t l1_tokens,
                                       const float* l1_weight) {
  return guarded([&] {
    constexpr const char* fn = "twell_training_backward";
    twell_training_plan& p = require(plan, fn, "plan");
    if (gradients == nullptr) invalid(fn, "gradients", "a pointer to a twell_ffn_gradients", "NULL");
    twell_training_state& s = require(state, fn, "state");
    twell::FfnGradients g;
    g.dx = gradients->dx;
    g.dw_gate = gradients->dw_gate;
    g.dw_up = gradients->dw_up;
    g.dw_down = gradients->dw_down;
    g.ld_dx = gradients->ld_dx;
    g.ld_dw_gate = gradients->ld_dw_gate;
    g.ld_dw_up = gradients->ld_dw_up;
    g.ld_dw_down = gradients->ld_dw_down;
    p.plan.backward(to_stream(stream), to_tensors(tensors, fn), dy, ld_dy, tokens, s.state, g, lambda, l1_tokens, l1_weight);
  });
}

}  // extern "C"
