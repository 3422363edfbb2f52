#include "comm/host_values.h"

#include <algorithm>

#include "core/error.h"
#include "core/memory.h"

namespace loom::comm {
namespace {

// A device tensor shaped as a host one, freed on destruction.
class Staged {
 public:
  Staged(Device device, const Tensor& like) : device_(device) {
    LOOM_CHECK(like.device().is_cpu() && like.is_contiguous(), "a host value to stage is ", like.str(), " on ",
               device_name(like.device()));
    data_ = device_memory(device_).allocate(device_.index, std::max<size_t>(like.nbytes(), 1));
    tensor_ = Tensor(data_, like.dtype(), like.shape(), device_);
  }
  ~Staged() { device_memory(device_).free(device_.index, data_); }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  Tensor& tensor() { return tensor_; }

 private:
  Device device_;
  void* data_ = nullptr;
  Tensor tensor_;
};

// run(buf) and waited for: on buf itself where comm works on the host, else
// on a device copy of it, copied back.
template <typename Run>
void in_place(Communicator& comm, Tensor buf, Run run) {
  if (comm.device().is_cpu()) return run(buf)->wait();
  Staged d(comm.device(), buf);
  copy_tensor(d.tensor(), buf);
  run(d.tensor())->wait();
  copy_tensor(buf, d.tensor());
}

}  // namespace

void all_reduce_host(Communicator& comm, Tensor buf, ReduceOp op) {
  in_place(comm, buf, [&](Tensor t) { return comm.all_reduce(t, op); });
}

void all_gather_host(Communicator& comm, Tensor out, Tensor in) {
  if (comm.device().is_cpu()) return comm.all_gather(out, in)->wait();
  Staged o(comm.device(), out), i(comm.device(), in);
  copy_tensor(i.tensor(), in);
  comm.all_gather(o.tensor(), i.tensor())->wait();
  copy_tensor(out, o.tensor());
}

}  // namespace loom::comm
