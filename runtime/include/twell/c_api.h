/* twell's C API: the runtime (contexts, FFN plans, the dense path, the hot/cold split's calibration)
 * through opaque handles, status codes and plain C structs, so that any language calls twell the way
 * it calls cuBLAS. The Python package (python/twell, ctypes) sits on it. Part of libtwell_runtime.so;
 * kernels come from bundles, or from the JIT when libtwell_jit.so is loaded into the process (it
 * registers itself when it loads: dlopen it, or link it).
 *
 *   twell_context_options co; twell_context_options_init(&co);
 *   twell_context_t ctx;  if (twell_context_create(&co, &ctx) != TWELL_SUCCESS) puts(twell_last_error());
 *   twell_ffn_spec spec;  twell_ffn_spec_init(&spec); spec.d_model = 2048; spec.d_ff = 5632;
 *   twell_plan_options po; twell_plan_options_init(&po);
 *   twell_plan_t plan;    twell_plan_create(ctx, &spec, 16384, &po, &plan);
 *   twell_ffn_tensors t = {x, w_gate, w_up, w_down, y};   (strides 0: dense rows)
 *   twell_plan_run(plan, stream, &t, tokens, 0);
 *   twell_plan_destroy(plan); twell_context_destroy(ctx);
 *
 * Training a layer (twell/training_plan.h):
 *   twell_training_plan_t tp;  twell_training_plan_create(ctx, &spec, 16384, -1, 0, &tp);   (-1: default backup; flags 0: fp32 dW, u kept)
 *   twell_training_state_t st; twell_training_state_create(tp, &st);
 *   twell_training_forward(tp, stream, &t, tokens, st, row_l1);                (row_l1 NULL or [tokens] fp32)
 *   twell_ffn_gradients g = {dx, dwg, dwu, dwd_t};                             (dwd_t: [d_ff, d_model] = dWd^T)
 *   twell_training_backward(tp, stream, &t, dy, 0, tokens, st, &g, lambda, 0, NULL);
 *   twell_training_state_destroy(st); twell_training_plan_destroy(tp);
 *
 * Conventions. Every function returns a twell_status_t; on failure twell_last_error() (thread-local,
 * valid until the calling thread's next twell call) holds the message, which names the argument, what
 * was expected and what was given. Output arguments are written only on success. Handles are not
 * thread-safe except contexts (plans of one context may be created from several threads; one plan's
 * calls must be ordered, as FfnPlan's). Destroying a context while plans of it live is allowed: the
 * plans keep what they need. Structs are passed by pointer and filled by their _init function first,
 * so that fields added later keep their defaults (struct_size guards the ABI: the library refuses a
 * struct of another size). Enum values and TWELL_C_API_VERSION change only by addition.
 * The C++ API (twell/context.h, twell/plan.h, twell/training_plan.h) documents each operation in full; this
 * header names it.
 */
#ifndef TWELL_C_API_H
#define TWELL_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TWELL_C_API_VERSION 7 /* 7: twell_training_plan_create_split, twell_choose_training_dense_neurons, describe's dense_neurons; 6: TWELL_TRAINING_DISPATCH_DENSE / _AUTO, twell_training_plan_recalibrate, twell_training_forward_keyed; 5: TWELL_TRAINING_DW_DOWN_AS_WEIGHT; 4: twell_training_plan_create's flags (TWELL_TRAINING_RECOMPUTE_U), state_bytes_per_row; 3: training plans (twell_training_*); 2: twell_plan_options gained the tuning fields, twell_context_tune */

typedef enum twell_status {
  TWELL_SUCCESS = 0,
  TWELL_ERROR_INVALID_ARGUMENT = 1, /* an argument out of contract (shape, dtype, pointer, alignment) */
  TWELL_ERROR_NOT_FOUND = 2,        /* a file, or a kernel missing from the bundles without a JIT */
  TWELL_ERROR_IO = 3,               /* a file could not be read or written */
  TWELL_ERROR_PARSE = 4,            /* a damaged bundle, cache entry or file */
  TWELL_ERROR_COMPILE = 5,          /* NVRTC or the generator rejected generated code */
  TWELL_ERROR_CUDA = 6,             /* a CUDA driver or cuBLASLt call failed */
  TWELL_ERROR_NO_DEVICE = 7,        /* no driver or GPU (compile-only use still works) */
  TWELL_ERROR_UNSUPPORTED = 8,      /* valid input this version does not implement */
  TWELL_ERROR_OUT_OF_MEMORY = 9,    /* a host allocation failed (device ones are TWELL_ERROR_CUDA) */
  TWELL_ERROR_INTERNAL = 10         /* a bug in twell: please report the message */
} twell_status_t;

typedef enum twell_dtype { TWELL_BF16 = 0, TWELL_FP16 = 1 } twell_dtype_t;
typedef enum twell_activation { TWELL_RELU = 0, TWELL_SILU = 1 } twell_activation_t;
typedef enum twell_weight_layout { TWELL_OUT_IN = 0, TWELL_IN_OUT = 1 } twell_weight_layout_t;
typedef enum twell_consumer { TWELL_CONSUMER_DEFAULT = -1, TWELL_ROW_GATHER = 0, TWELL_TOKEN_BLOCK = 1 } twell_consumer_t;
typedef enum twell_dispatch { TWELL_DISPATCH_AUTO = 0, TWELL_DISPATCH_SPARSE = 1, TWELL_DISPATCH_DENSE = 2 } twell_dispatch_t;
/* twell::DenseKernels (twell/dense.h): cuBLASLt's first algorithm; the fused gated-up kernel (calls of more than
 * 64 tokens; cuBLASLt at fewer); cublasGemmEx as
 * PyTorch calls it; cuBLASLt with its first 8 algorithms timed at the first run (the fastest baseline). */
typedef enum twell_dense_kernels {
  TWELL_DENSE_CUBLASLT = 0,
  TWELL_DENSE_FUSED_GATED_UP = 1,
  TWELL_DENSE_CUBLAS = 2,
  TWELL_DENSE_CUBLASLT_TUNED = 3
} twell_dense_kernels_t;
typedef enum twell_jit_policy { TWELL_JIT_IF_LINKED = 0, TWELL_JIT_NEVER = 1 } twell_jit_policy_t;

typedef struct twell_context* twell_context_t;
typedef struct twell_plan* twell_plan_t;
typedef struct twell_dense* twell_dense_t;
typedef struct twell_training_plan* twell_training_plan_t;
typedef struct twell_training_state* twell_training_state_t;

/* ContextOptions (twell/context.h). */
typedef struct twell_context_options {
  size_t struct_size;
  int device;               /* CUDA device index; -1: none (compile-only). Default 0. */
  const char* cache_dir;    /* NULL: $TWELL_CACHE_DIR, else $XDG_CACHE_HOME/twell, else ~/.cache/twell */
  int disk_cache;           /* nonzero: kernels are cached on disk. Default 1. */
  int target_sm;            /* 0: the device's feature set; else e.g. 90 (with target_arch_specific: sm_90a), 80 */
  int target_arch_specific; /* the "a" suffix; read only when target_sm != 0 */
  const char* const* bundles; /* num_bundles bundle directories to load at creation, in order */
  size_t num_bundles;
  twell_jit_policy_t jit;   /* Default TWELL_JIT_IF_LINKED. */
} twell_context_options;

/* FfnSpec (twell/spec.h): y = (act(x Wg^T) * (x Wu^T)) Wd^T (gated) or act(x Wg^T) Wd^T. */
typedef struct twell_ffn_spec {
  size_t struct_size;
  int64_t d_model, d_ff;
  int gated;                         /* Default 1. */
  twell_activation_t activation;     /* Default TWELL_RELU. */
  float threshold;                   /* ReLU: active iff a > threshold (>= 0); SiLU: |a| > threshold (> 0) */
  twell_dtype_t dtype;               /* Default TWELL_BF16. */
  twell_weight_layout_t down_layout; /* Default TWELL_OUT_IN (nn.Linear's [d_model, d_ff]). */
  int tile_n;                        /* 0: the generator chooses (256) */
  int slots;                         /* 0: the generator chooses (31) */
  twell_consumer_t consumer;         /* Default TWELL_CONSUMER_DEFAULT. */
  int gate_cluster_m;                /* 0: the generator chooses */
} twell_ffn_spec;

/* PlanOptions (twell/plan.h). */
typedef struct twell_plan_options {
  size_t struct_size;
  int64_t backup_capacity;   /* -1: the default (max_tokens * tiles / 16, at least 256) */
  twell_dispatch_t dispatch; /* Default TWELL_DISPATCH_AUTO. */
  int64_t dense_neurons;     /* the hot/cold split: the first dense_neurons neurons run dense. Default 0. */
  int64_t decode_max_tokens; /* calls of at most this many tokens take the decode kernels. Default 64. */
  int use_tuning;              /* nonzero (default): layouts the spec leaves unset come from the tuning database
                                  (twell/tuning.h) where it holds this GPU's and spec's entry; 0: ignore it */
  const char* tuning_workload; /* NULL or "" (default): the most recently tuned workload; else e.g. "density:0.5%" */
  const char* tuning_dir;      /* NULL or "" (default): $TWELL_TUNING_DIR, else <kernel cache>/tuning */
  int64_t decode_fused_max_tokens; /* calls of at most this many tokens (0..32) take the one fused decode kernel
                                      where it fits (PlanOptions::decode_fused_max_tokens): y within 1e-2 of the other kernels',
                                      not their bits; no TwELL matrix. Default 32; 0: never */
} twell_plan_options;

/* FfnTensors (twell/plan.h): device pointers of spec.dtype; row strides in elements (0: dense rows). */
typedef struct twell_ffn_tensors {
  const void* x;      /* [tokens, d_model] */
  const void* w_gate; /* [d_ff, d_model] */
  const void* w_up;   /* [d_ff, d_model]; NULL for a non-gated spec */
  const void* w_down; /* [d_model, d_ff] (out_in) or [d_ff, d_model] (in_out) */
  void* y;            /* [tokens, d_model] */
  int64_t ld_x, ld_gate, ld_up, ld_down, ld_y;
} twell_ffn_tensors;

/* FfnGradients (twell/training_plan.h): the backward's outputs, device pointers; strides in elements (0: dense).
 * dw_down is dWd in the in_out layout ([d_ff, d_model], dWd^T) whatever the spec's down_layout, or, where the
 * plan has TWELL_TRAINING_DW_DOWN_AS_WEIGHT, in the spec's down_layout ([d_model, d_ff] for out_in). */
typedef struct twell_ffn_gradients {
  void* dx;      /* [tokens, d_model] spec dtype */
  void* dw_gate; /* [d_ff, d_model] fp32 (or the spec dtype: TWELL_TRAINING_GRADIENTS_IN_DTYPE) */
  void* dw_up;   /* [d_ff, d_model]; NULL for a non-gated spec */
  void* dw_down; /* [d_ff, d_model]: dWd^T (TWELL_TRAINING_DW_DOWN_AS_WEIGHT with out_in: [d_model, d_ff]) */
  int64_t ld_dx, ld_dw_gate, ld_dw_up, ld_dw_down;
} twell_ffn_gradients;

typedef struct twell_overflow_report {
  uint32_t overflowing_tile_rows;
  uint32_t backup_capacity;
  int recomputed;
} twell_overflow_report;

/* Library */
int twell_c_api_version(void);                       /* TWELL_C_API_VERSION of the library */
const char* twell_version(void);                     /* the project version, e.g. "0.3.0" */
const char* twell_status_string(twell_status_t status); /* "TWELL_ERROR_INVALID_ARGUMENT", ... */
const char* twell_last_error(void);                  /* the calling thread's last failure ("" if none) */
int twell_jit_available(void);                       /* nonzero when libtwell_jit.so is loaded */

void twell_context_options_init(twell_context_options* options);
void twell_ffn_spec_init(twell_ffn_spec* spec);
void twell_plan_options_init(twell_plan_options* options);

/* Contexts (twell::Context). options NULL: the defaults. Never fails for a missing GPU (has_gpu = 0). */
twell_status_t twell_context_create(const twell_context_options* options, twell_context_t* context);
twell_status_t twell_context_destroy(twell_context_t context); /* NULL is a no-op */
/* has_gpu, sm_count (0 without a GPU), target (e.g. "sm_90a"), device name ("none" without a GPU), and
 * why there is no GPU ("" with one). Strings are owned by the context. Any output may be NULL. */
twell_status_t twell_context_info(twell_context_t context, int* has_gpu, int* sm_count, const char** target,
                                  const char** device_name, const char** no_gpu_reason);
twell_status_t twell_context_load_bundle(twell_context_t context, const char* dir);
/* Autotunes plans of `spec` on the context's GPU (twell::tune, twell/tuning.h) and stores the result in
 * the tuning database, which later plans read. request_json (NULL: the defaults) is an object with
 * any of "tokens" (array of counts), "density" (fraction), "weights" (array of safetensors paths) with
 * "layer", "budget_s", "reps", "write" (bool), "database" (directory). *result_json receives the result
 * (workload, file, seconds, configurations, pruned, compiled, outliers, buckets with winner, runner_up,
 * heuristic_ms, dense_ms), owned by the library, valid until the calling thread's next tune. Values must have
 * the documented types (integers for tokens, reps and layer; no truncation): else TWELL_ERROR_INVALID_ARGUMENT
 * naming the key. */
twell_status_t twell_context_tune(twell_context_t context, const twell_ffn_spec* spec, const char* request_json,
                                  const char** result_json);

/* Plans (twell::FfnPlan). options NULL: the defaults. */
twell_status_t twell_plan_create(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                 const twell_plan_options* options, twell_plan_t* plan);
twell_status_t twell_plan_destroy(twell_plan_t plan); /* NULL is a no-op */
/* y = FFN(x) for `tokens` rows (0..max_tokens) on `stream` (a CUstream / cudaStream_t; NULL: the legacy
 * default stream), no host synchronization except Dispatch Auto's first call per (decision_key, token
 * bucket), which times the paths (FfnPlan::run). Capturable in a CUDA graph after that warm-up. */
twell_status_t twell_plan_run(twell_plan_t plan, void* stream, const twell_ffn_tensors* tensors, int64_t tokens,
                              uint64_t decision_key);
twell_status_t twell_plan_max_tokens(twell_plan_t plan, int64_t* max_tokens);
/* The path the last run took: "twell", "dense" or "" (owned by the plan, valid until its next call). */
twell_status_t twell_plan_last_path(twell_plan_t plan, const char** path);
twell_status_t twell_plan_recalibrate(twell_plan_t plan);
/* The plan as JSON: spec, layout, target, max_tokens, dense_neurons, runnable, and each kernel's report
 * (name, kind, cache, compile_ms, load_ms, ptx_bytes, cubin_bytes, arch, consumer, threads, cta_m, ...).
 * Owned by the plan, valid until its next call. */
twell_status_t twell_plan_describe(twell_plan_t plan, const char** json);
/* Synchronizes `stream`; the overflow counters of the last run (FfnPlan::last_overflow). */
twell_status_t twell_plan_last_overflow(twell_plan_t plan, void* stream, twell_overflow_report* report);
/* Synchronizes `stream`; per TwELL neuron (d_ff - dense_neurons of them: `count` must equal it), the
 * number of rows of the last run in which it was active (neuron_activity of download_twell): the
 * calibration of the hot/cold split. Run with TWELL_DISPATCH_SPARSE plans (a dense run holds no TwELL
 * matrix: TWELL_ERROR_INVALID_ARGUMENT). *rows receives the run's token count. */
twell_status_t twell_plan_neuron_activity(twell_plan_t plan, void* stream, uint64_t* activity, int64_t count,
                                          int64_t* rows);

/* The split with the least predicted time (choose_dense_neurons, twell/neuron_order.h, default cost
 * model): sorted_activity holds spec->d_ff counts over `rows` calibration rows, sorted descending. */
twell_status_t twell_choose_dense_neurons(const twell_ffn_spec* spec, int64_t tokens, const uint64_t* sorted_activity,
                                          int64_t count, int64_t rows, int64_t* dense_neurons);
/* The training step's split (choose_training_dense_neurons, twell/neuron_order.h, default cost model), the
 * same arguments: 0 (the TwELL path alone), a split for twell_training_plan_create_split, or d_ff (the dense
 * path: TWELL_TRAINING_DISPATCH_DENSE). */
twell_status_t twell_choose_training_dense_neurons(const twell_ffn_spec* spec, int64_t tokens, const uint64_t* sorted_activity,
                                                   int64_t count, int64_t rows, int64_t* dense_neurons);

/* The dense path (twell::DenseFfn, twell/dense.h): cuBLASLt GEMMs, the fused gate + up kernel, or cuBLAS's
 * cublasGemmEx as PyTorch calls it (the baseline). */
twell_status_t twell_dense_create(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                  twell_dense_kernels_t kernels, twell_dense_t* dense);
twell_status_t twell_dense_destroy(twell_dense_t dense); /* NULL is a no-op */
twell_status_t twell_dense_run(twell_dense_t dense, void* stream, const twell_ffn_tensors* tensors, int64_t tokens);

/* Training (twell::FfnTrainingPlan, twell/training_plan.h): the forward keeps the TwELL matrix of
 * act(g) in a state; the backward returns dx, dWg, dWu, dWd^T (dWd as the weight with
 * TWELL_TRAINING_DW_DOWN_AS_WEIGHT). backup_capacity -1: the default. flags: 0
 * or a bitwise or of TWELL_TRAINING_GRADIENTS_IN_DTYPE (weight gradients in the spec's dtype, not fp32) and
 * TWELL_TRAINING_RECOMPUTE_U (TrainingPlanOptions::keep_u false: the state does not keep u per entry, 4
 * bytes per TwELL word less; the backward recomputes it, the same bits) and TWELL_TRAINING_DW_DOWN_AS_WEIGHT
 * (TrainingPlanOptions::dw_down_as_weight: dWd in Wd's own layout; with an out_in Wd it needs
 * TWELL_TRAINING_GRADIENTS_IN_DTYPE), and at most one of TWELL_TRAINING_DISPATCH_DENSE (every step on the
 * dense path: cuBLASLt GEMMs) and TWELL_TRAINING_DISPATCH_AUTO (per power-of-two token bucket, the first
 * forward times both paths and keeps the faster; TrainingDispatch): neither, the TwELL kernels. */
#define TWELL_TRAINING_GRADIENTS_IN_DTYPE 1
#define TWELL_TRAINING_RECOMPUTE_U 2
#define TWELL_TRAINING_DW_DOWN_AS_WEIGHT 4
#define TWELL_TRAINING_DISPATCH_DENSE 8
#define TWELL_TRAINING_DISPATCH_AUTO 16
twell_status_t twell_training_plan_create(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                          int64_t backup_capacity, int flags, twell_training_plan_t* plan);
/* twell_training_plan_create with the hot/cold split (TrainingPlanOptions::dense_neurons: a multiple of 64
 * below d_ff, 0 none): neurons 0..dense_neurons-1 of weights ordered hot-first (by the
 * caller: twell/neuron_order.h) on the dense path's GEMMs, the others on the TwELL kernels; a state serves one backward. */
twell_status_t twell_training_plan_create_split(twell_context_t context, const twell_ffn_spec* spec, int64_t max_tokens,
                                                int64_t backup_capacity, int flags, int64_t dense_neurons,
                                                twell_training_plan_t* plan);
twell_status_t twell_training_plan_destroy(twell_training_plan_t plan); /* NULL is a no-op */
/* The plan as JSON (its spec, layout, max_tokens and kernels, as twell_plan_describe, state_bytes_per_row:
 * a state's device bytes per token row, 4 or 8 per TwELL word (a split plan's: of its TwELL neurons, plus its
 * dense neurons' g and u, 2 bytes each per neuron), and the flags as gradients_in_dtype, keep_u
 * (the option asked; state_bytes_per_row says whether the kernels keep u) and dw_down_as_weight, dense_neurons, dispatch
 * ("sparse", "dense", "auto"), dense_state_bytes_per_row (a state after a dense forward: g and u of all d_ff
 * neurons; given for every plan) and
 * decisions (dispatch auto's so far: decision_key, max_tokens, path, sparse_ms, dense_ms and the timed steps
 * behind each, sparse_steps and dense_steps)); owned by the plan. */
twell_status_t twell_training_plan_describe(twell_training_plan_t plan, const char** json);
/* Forgets dispatch auto's decisions (FfnTrainingPlan::recalibrate): the next forward of each bucket times
 * both paths again. */
twell_status_t twell_training_plan_recalibrate(twell_training_plan_t plan);
twell_status_t twell_training_state_create(twell_training_plan_t plan, twell_training_state_t* state);
twell_status_t twell_training_state_destroy(twell_training_state_t state); /* NULL is a no-op */
/* y (tensors->y) and, where row_l1 is not NULL, each row's sum |h| ([tokens] fp32 device memory: the L1
 * term is their sum / tokens); the TwELL matrix (dense path: g and u) goes into `state`. tensors->y and row_l1 both NULL: the
 * gate alone (the state, all a backward reads). No host synchronization unless the state must grow (its
 * first use, more tokens, a larger backup: the stream is synchronized before its old buffers go). The
 * TwELL path's backward waits on the host for the forward's gate (the dense path's does not); a backward
 * synchronizes the stream when its scratch grows;
 * run a state's forward and backward on one stream (or order them yourself). */
twell_status_t twell_training_forward(twell_training_plan_t plan, void* stream, const twell_ffn_tensors* tensors,
                                      int64_t tokens, twell_training_state_t state, float* row_l1);
/* twell_training_forward with dispatch auto's decision key (FfnTrainingPlan::forward's decision_key: layers of
 * one shape sharing a plan decide apart; twell_training_forward uses key 0). */
twell_status_t twell_training_forward_keyed(twell_training_plan_t plan, void* stream, const twell_ffn_tensors* tensors,
                                            int64_t tokens, twell_training_state_t state, float* row_l1,
                                            uint64_t decision_key);
/* The gradients of L(y) + lambda * l1 for dy (FfnTrainingPlan::backward): tensors and tokens as the state's
 * forward (y unused); lambda finite, >= 0; l1_tokens 0: tokens; l1_weight NULL or a device fp32 that
 * multiplies lambda / l1_tokens. Gradients are written, not accumulated. Waits on the host for the forward's
 * overflow count (an event); grows the plan's scratch (cuMemAlloc) as needed. The plan's layout comes from
 * the tuning database as with twell_plan_create's defaults. */
twell_status_t twell_training_backward(twell_training_plan_t plan, void* stream, const twell_ffn_tensors* tensors,
                                       const void* dy, int64_t ld_dy, int64_t tokens, twell_training_state_t state,
                                       const twell_ffn_gradients* gradients, float lambda, int64_t l1_tokens,
                                       const float* l1_weight);

#ifdef __cplusplus
}
#endif

#endif /* TWELL_C_API_H */
