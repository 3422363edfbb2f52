// The point-to-point layer loom's ring algorithms run on: MPI in the MPI
// backend (MpiP2p in mpi_collectives.cpp), an in-memory transport between threads in the unit
// tests. Messages from one rank to another match the receives posted for
// them in posting order (MPI's non-overtaking rule for one tag), which is
// all the ring needs: both ends split a chunk into the same pieces.
#pragma once

#include <cstddef>

namespace loom::comm {

class P2p {
 public:
  virtual ~P2p() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Post a send / receive of `bytes` bytes and return its handle; the buffer
  // must stay untouched until the handle is waited on (or wait_all returns).
  virtual int isend(const void* data, size_t bytes, int peer) = 0;
  virtual int irecv(void* data, size_t bytes, int peer) = 0;
  virtual void wait(int handle) = 0;
  // Waits for every posted message; handles start again from 0.
  virtual void wait_all() = 0;
};

}  // namespace loom::comm
