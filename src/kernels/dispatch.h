// The step from a checked op (ops_*.cpp) to its backend (backend.h).
// Internal to src/kernels.
#pragma once

#include <initializer_list>
#include <span>

#include "kernels/backend.h"
#include "kernels/validate.h"

namespace loom::kernels {

// The backend serving the device of every defined operand of one call. A
// loom::Error naming the op if two operands are on different devices ("a is
// on cpu but b is on cuda:0") or no backend serves their device ("no kernel
// backend for cuda:0 (...); this build has: cpu"). One pass over the
// operands and one table load: called once per op call.
const Backend& backend_of(const char* op, std::initializer_list<Operand> operands);
// The same for a list of tensors named name[i] (global_norm); at least one.
const Backend& backend_of(const char* op, const char* name, std::span<const Tensor> tensors);

namespace detail {
// `real`, or the op tracer's timing table in front of it on a thread whose
// ops an OpTracer times (op_trace.h).
const Backend* traced_table(const Backend& real);
// Makes b (a level's table, cpu_isa.cpp) the backend of CPU tensors.
void install_cpu_backend(const Backend* b);
}  // namespace detail

}  // namespace loom::kernels
