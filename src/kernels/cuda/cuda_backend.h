// The CUDA backend (DESIGN.md §2, kernels/cuda): every op of the kernel
// backend table (kernels/backend.h) for tensors on an NVIDIA GPU, and the
// device memory (core/memory.h's DeviceMemory) that pools of Device::cuda
// allocate from. Built where cmake/cuda.cmake finds nvcc (library
// loom_kernels_cuda, which defines LOOM_HAVE_CUDA=1 for its users).
//
// One GPU per process: register_cuda_backend(i) makes device i current, and
// every cuda tensor of the process lives on it. Ops, the pools' frees and
// copies are enqueued on the device's compute stream (cuda_stream(), made
// at registration: the Context's stream, core/memory.h), which the NCCL
// backend's streams (comm/nccl, handed it by nccl_world) wait for at each
// op's issue, so a collective on a tensor an op just wrote needs no extra
// synchronisation. The stream is blocking: work on the legacy default stream
// is ordered with it both ways. An op returns once its kernels are
// enqueued, except those that return a value to the host (sum_squares,
// global_norm, all_finite, the cross-entropy losses, find_id_outside) and
// those that check ids against a range (embedding, cross-entropy targets,
// kv_cache_write slots, paged attention's block tables, gather_columns, MoE
// rows), which wait for the GPU so
// that a bad id is a loom::Error raised by the call that read it, with the
// CPU backend's message.
#pragma once

#include <string>

#include "core/memory.h"

namespace loom::kernels {

// Empty when this process can use CUDA device `index`, else why not (no
// driver, no such device, a driver older than the runtime loom was built
// with, a device without the compute capability loom was compiled for).
std::string cuda_unavailable_reason(int index = 0);
// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, driver 13.0" (index must be usable).
std::string cuda_device_description(int index = 0);
// Makes device `index` current for this process and registers the CUDA
// backend table and device memory for Device::cuda. Idempotent for the same
// index; loom::Error with cuda_unavailable_reason's text when the device is
// not usable, or when another index was registered before.
void register_cuda_backend(int index = 0);
// The registered device's compute stream (Stream::handle a cudaStream_t),
// which device_stream(Device::cuda(i)) also returns; Stream{cpu} before
// register_cuda_backend.
Stream cuda_stream();
// Waits until every op enqueued so far has finished; loom::Error naming the
// failure if a kernel failed.
void cuda_synchronize();

}  // namespace loom::kernels
