// Collectives of small host values (counts, digests, flags, a loss) on any
// communicator: run directly where the communicator works on the host; on a
// device's (NCCL takes device memory only) staged through device buffers of
// the same bytes: copied in, the op run and waited for, copied back. Each
// call is blocking and collective over `comm`, as the op it runs.
#pragma once

#include "comm/communicator.h"

namespace loom::comm {

void all_reduce_host(Communicator& comm, Tensor buf, ReduceOp op);
// out: size() equal blocks of in's numel, in rank order (every rank's in).
void all_gather_host(Communicator& comm, Tensor out, Tensor in);

}  // namespace loom::comm
