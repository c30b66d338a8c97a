// The training kernels' entry points on a context's Impl (twell/training.h's functions take a Context&;
// FfnTrainingPlan holds the Impl, as FfnPlan does, so that it outlives the Context object).
#pragma once
#include <memory>

#include "context_impl.h"
#include "twell/training.h"

namespace twell::detail {

void train_row_backward(const std::shared_ptr<Context::Impl>& ctx, Stream stream, const FfnSpec& spec,
                        const TrainRowBackwardTensors& t, int64_t tokens, uint32_t backup_capacity,
                        uint32_t grad_capacity, float lambda, int64_t l1_tokens);
void train_weight_grad(const std::shared_ptr<Context::Impl>& ctx, Stream stream, const FfnSpec& spec,
                       const TrainWeightGradTensors& t, int64_t tokens, uint32_t grad_capacity);

}  // namespace twell::detail
