/* The C API from C (C11, no C++): twell/c_api.h compiles as C, and a program linking the runtime
 * alone creates a compile-only context, reads its info, gets clear errors for bad arguments, and (when
 * libtwell_jit.so is linked into the program, here it is not) would make plans. Exit status 0 = pass. */
#include <stdio.h>
#include <string.h>

#include "twell/c_api.h"

static int failures = 0;
#define EXPECT(cond, what)                                             \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, what, twell_last_error()); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

int main(void) {
  EXPECT(twell_c_api_version() == TWELL_C_API_VERSION, "the library's C API version is the header's");
  EXPECT(strcmp(twell_status_string(TWELL_ERROR_CUDA), "TWELL_ERROR_CUDA") == 0, "status names");

  twell_context_options options;
  twell_context_options_init(&options);
  options.device = -1; /* compile only: no GPU needed */
  twell_context_t context = NULL;
  EXPECT(twell_context_create(&options, &context) == TWELL_SUCCESS && context != NULL, "a compile-only context");
  int has_gpu = 1;
  const char* target = NULL;
  EXPECT(twell_context_info(context, &has_gpu, NULL, &target, NULL, NULL) == TWELL_SUCCESS, "context info");
  EXPECT(has_gpu == 0 && target != NULL && strcmp(target, "sm_90a") == 0, "no GPU, the default target sm_90a");

  /* Without libtwell_jit.so in the process a plan needs a bundle: a clear NOT_FOUND / UNSUPPORTED. */
  twell_ffn_spec spec;
  twell_ffn_spec_init(&spec);
  spec.d_model = 512;
  spec.d_ff = 1408;
  twell_plan_t plan = NULL;
  twell_status_t s = twell_plan_create(context, &spec, 256, NULL, &plan);
  EXPECT(twell_jit_available() == 0, "no JIT linked into this program");
  EXPECT((s == TWELL_ERROR_NOT_FOUND || s == TWELL_ERROR_UNSUPPORTED) && plan == NULL, "no kernels without a JIT or bundle");
  EXPECT(strlen(twell_last_error()) > 0, "a message says why");

  /* Bad arguments: named in the message, nothing written. */
  spec.d_ff = 0;
  EXPECT(twell_plan_create(context, &spec, 256, NULL, &plan) == TWELL_ERROR_INVALID_ARGUMENT && plan == NULL, "d_ff 0");
  EXPECT(strstr(twell_last_error(), "d_ff") != NULL, "the message names d_ff");
  spec.d_ff = 1408;
  spec.struct_size = 3;
  EXPECT(twell_plan_create(context, &spec, 256, NULL, &plan) == TWELL_ERROR_INVALID_ARGUMENT, "a struct of another size");
  EXPECT(strstr(twell_last_error(), "struct_size") != NULL, "the message names struct_size");
  EXPECT(twell_plan_run(NULL, NULL, NULL, 1, 0) == TWELL_ERROR_INVALID_ARGUMENT, "a NULL plan");
  EXPECT(twell_context_load_bundle(context, "/nonexistent/bundle") == TWELL_ERROR_NOT_FOUND, "a missing bundle");
  twell_ffn_spec_init(&spec);
  spec.d_model = 512;
  spec.d_ff = 1408;
  twell_plan_options plan_options;
  twell_plan_options_init(&plan_options);
  EXPECT(plan_options.decode_fused_max_tokens == 32, "decode_fused_max_tokens defaults to PlanOptions' 32");
  plan_options.decode_fused_max_tokens = 33;
  EXPECT(twell_plan_create(context, &spec, 256, &plan_options, &plan) == TWELL_ERROR_INVALID_ARGUMENT && plan == NULL,
         "decode_fused_max_tokens 33 (past the fused kernel's 32 rows)");
  EXPECT(strstr(twell_last_error(), "decode_fused_max_tokens") != NULL, "the message names decode_fused_max_tokens");
  twell_dense_t dense = NULL;
  EXPECT(twell_dense_create(context, &spec, 256, (twell_dense_kernels_t)(TWELL_DENSE_CUBLASLT_TUNED + 1), &dense) ==
             TWELL_ERROR_INVALID_ARGUMENT && dense == NULL, "a dense-kernels value past the enum");
  EXPECT(strstr(twell_last_error(), "kernels") != NULL, "the message names kernels");
  /* Training plans (C API v3): bad arguments are named; the handle stays NULL. */
  twell_training_plan_t training = NULL;
  EXPECT(twell_training_plan_create(context, &spec, 256, -2, 0, &training) == TWELL_ERROR_INVALID_ARGUMENT &&
             training == NULL, "a backup_capacity of -2");
  EXPECT(strstr(twell_last_error(), "backup_capacity") != NULL, "the message names backup_capacity");
  EXPECT(twell_training_plan_create(context, &spec, 256, -1, 32, &training) == TWELL_ERROR_INVALID_ARGUMENT &&
             training == NULL, "flags 32");
  EXPECT(strstr(twell_last_error(), "flags") != NULL, "the message names flags");
  /* v6: at most one dispatch flag. */
  EXPECT(twell_training_plan_create(context, &spec, 256, -1, TWELL_TRAINING_DISPATCH_DENSE | TWELL_TRAINING_DISPATCH_AUTO,
                                    &training) == TWELL_ERROR_INVALID_ARGUMENT && training == NULL &&
             strstr(twell_last_error(), "flags") != NULL,
         "both dispatch flags are refused by name");
  /* v5: dWd in an out_in Wd's layout (the default spec's) needs gradients in the spec's dtype. */
  EXPECT(twell_training_plan_create(context, &spec, 256, -1, TWELL_TRAINING_DW_DOWN_AS_WEIGHT, &training) ==
             TWELL_ERROR_INVALID_ARGUMENT && training == NULL && strstr(twell_last_error(), "dw_down_as_weight") != NULL,
         "TWELL_TRAINING_DW_DOWN_AS_WEIGHT with fp32 gradients is refused by name");
  /* v7: the split's dense_neurons, a multiple of 64 below d_ff. */
  EXPECT(twell_training_plan_create_split(context, &spec, 256, -1, 0, 100, &training) == TWELL_ERROR_INVALID_ARGUMENT &&
             training == NULL && strstr(twell_last_error(), "dense_neurons") != NULL,
         "dense_neurons 100 is refused by name");
  EXPECT(twell_training_forward(NULL, NULL, NULL, 1, NULL, NULL) == TWELL_ERROR_INVALID_ARGUMENT &&
             strstr(twell_last_error(), "plan") != NULL, "a NULL training plan is named");
  EXPECT(twell_training_plan_destroy(NULL) == TWELL_SUCCESS && twell_training_state_destroy(NULL) == TWELL_SUCCESS,
         "destroying NULL handles is a no-op");

  /* A success clears the message. */
  EXPECT(twell_context_info(context, NULL, NULL, NULL, NULL, NULL) == TWELL_SUCCESS && twell_last_error()[0] == '\0',
         "success clears the last error");
  EXPECT(twell_context_destroy(context) == TWELL_SUCCESS, "destroy");
  if (failures == 0) printf("c_api: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
