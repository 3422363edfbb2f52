// The backend registry (backend.h) and the dispatch step (dispatch.h).
//
// The registry is one slot per device kind. The CPU slot holds the table of
// the instruction-set level chosen at start-up (cpu_isa.h): filled by
// set_cpu_isa, or on the first CPU op with the best level the CPU has (so no
// start-up order matters); register_backend fills another slot. It is the
// only mutable state of the dispatch layer, and it is read with one atomic
// load per op call.
#include "kernels/backend.h"

#include <array>
#include <atomic>
#include <iterator>

#include "kernels/cpu_isa.h"
#include "kernels/dispatch.h"

namespace loom::kernels {
namespace {

constexpr int kDeviceKinds = 2;  // Device::Kind: cpu, cuda

constexpr const char* kOpNames[] = {
#define LOOM_KERNEL_OP_NAME(op, ret, params) #op,
    LOOM_KERNEL_OPS(LOOM_KERNEL_OP_NAME)
#undef LOOM_KERNEL_OP_NAME
};

constinit std::array<std::atomic<const Backend*>, kDeviceKinds> g_backends{nullptr, nullptr};

std::atomic<const Backend*>& slot(Device::Kind kind) {
  const auto i = static_cast<size_t>(kind);
  LOOM_CHECK(i < g_backends.size(), "device kind ", i, " has no registry slot");
  return g_backends[i];
}

const char* kind_name(Device::Kind kind) { return kind == Device::Kind::cpu ? "cpu" : "cuda"; }

// "cpu" or "cpu, cuda": the registered backends, for messages.
std::string backend_names() {
  std::string names;
  for (const Backend* b : registered_backends()) names += (names.empty() ? "" : ", ") + std::string(b->name);
  return names;
}

[[noreturn]] void no_backend(const char* op, Device d, const std::string& operands) {
  fail(op, ": no kernel backend for ", device_name(d), " (", operands, "); this build has: ", backend_names());
}

}  // namespace

std::span<const char* const> backend_op_names() { return kOpNames; }

std::vector<std::string> backend_missing_ops(const Backend& b) {
  std::vector<std::string> missing;
  size_t i = 0;
#define LOOM_KERNEL_OP_MISSING(op, ret, params) \
  if (b.op == nullptr) missing.push_back(kOpNames[i]);  \
  ++i;
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_MISSING)
#undef LOOM_KERNEL_OP_MISSING
  return missing;
}

void register_backend(const Backend& b) {
  const std::string name = b.name != nullptr ? b.name : "(unnamed)";
  const std::vector<std::string> missing = backend_missing_ops(b);
  if (!missing.empty()) {
    std::string list;
    for (const std::string& op : missing) list += (list.empty() ? "" : ", ") + op;
    fail("register_backend: backend '", name, "' lacks ", missing.size(), " of the ", std::size(kOpNames), " ops: ", list);
  }
  if (b.kind == Device::Kind::cpu) find_backend(Device::cpu());  // the level's table is there first
  const Backend* expected = nullptr;
  if (!slot(b.kind).compare_exchange_strong(expected, &b, std::memory_order_acq_rel) && expected != &b)
    fail("register_backend: backend '", name, "' is for ", kind_name(b.kind), " devices, which backend '",
         expected->name, "' already serves");
}

const Backend* find_backend(Device d) {
  const Backend* b = slot(d.kind).load(std::memory_order_acquire);
  if (b != nullptr || d.kind != Device::Kind::cpu) return b;
  cpu_isa();  // chooses the level, which installs its table
  return slot(d.kind).load(std::memory_order_acquire);
}

namespace detail {

void install_cpu_backend(const Backend* b) { slot(Device::Kind::cpu).store(b, std::memory_order_release); }

}  // namespace detail

std::vector<const Backend*> registered_backends() {
  find_backend(Device::cpu());  // the CPU one exists once asked for
  std::vector<const Backend*> out;
  for (const auto& s : g_backends)
    if (const Backend* b = s.load(std::memory_order_acquire)) out.push_back(b);
  return out;
}

const Backend& backend_of(const char* op, std::initializer_list<Operand> operands) {
  const Operand* first = nullptr;
  for (const Operand& o : operands) {
    if (!o.t.defined()) continue;
    if (first == nullptr) {
      first = &o;
    } else if (!(o.t.device() == first->t.device())) {
      op_fail(op, {*first, o}, first->name, " is on ", device_name(first->t.device()), " but ", o.name, " is on ",
              device_name(o.t.device()), ": one call's operands share a device");
    }
  }
  LOOM_CHECK(first != nullptr, op, ": dispatched without a defined operand");
  if (const Backend* b = find_backend(first->t.device())) return *detail::traced_table(*b);
  no_backend(op, first->t.device(), describe(operands));
}

const Backend& backend_of(const char* op, const char* name, std::span<const Tensor> tensors) {
  LOOM_CHECK(!tensors.empty(), op, ": dispatched without a tensor");
  const Device d = tensors[0].device();
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (!(tensors[i].device() == d))
      fail(op, ": ", name, "[0] is on ", device_name(d), " but ", name, "[", i, "] is on ",
           device_name(tensors[i].device()), ": one call's operands share a device");
  }
  if (const Backend* b = find_backend(d)) return *detail::traced_table(*b);
  no_backend(op, d, concat(tensors.size(), " tensors ", name, "[i]"));
}

}  // namespace loom::kernels
