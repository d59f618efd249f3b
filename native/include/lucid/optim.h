// Optimizer update chains of `fused` instructions run as one native pass (optim.cpp).
#pragma once

#include <string>
#include <vector>

#include "lucid/kernels.h"

namespace lucid {

// The step of a fused instruction that is a recognized optimizer update (Adam, AdamW, RMSprop
// without centering or momentum, Adagrad; see optim.cpp), or null when it is not one. `fallback` (the generic evaluator's step) runs instead
// when a run's buffers overlap in a way the one-pass kernel cannot take.
Step make_update_step(const Program& p, const Instr& in, const std::vector<ExprNode>& nodes,
                      const std::vector<int>& out_nodes, Step fallback);

// The recognized kernel's name ("adam", "rmsprop", "adagrad") for instruction `in`, or ""
// (diagnostics and tests).
std::string update_kernel_name(const Program& p, const Instr& in);

}  // namespace lucid
