// Which of a rank's point-to-point streams a message travels on, in the
// backends whose messages queue per stream (NCCL: each NCCL communicator has
// one CUDA stream, on which an op starts only once the op before it has
// finished, and a send finishes only once its receive has started).
//
// A message between two ranks that are neighbours in rank order (r and
// r + 1 mod size: the pipeline's stages, the context-parallel ring) has a
// stream of its own per direction, shared with no other pair, so the queue
// adds no order the messages of that pair do not already have (they match
// in issue order). Any other message shares one stream per direction, lower
// to higher rank or higher to lower, with every such message of the rank:
// there one pair's slow receive holds back the rank's later messages to
// other ranks. At size 2 the two directions are the two neighbour streams.
#pragma once

namespace loom::comm {

enum class P2pLink : int { up, down, to_next, from_next, to_prev, from_prev };
inline constexpr int kP2pLinks = 6;

// The stream of a send (is_send) to, or a receive from, `peer` on `rank` of
// a communicator of `size` ranks; peer != rank.
inline P2pLink p2p_link(int rank, int size, int peer, bool is_send) {
  if (size > 2) {
    if (peer == (rank + 1) % size) return is_send ? P2pLink::to_next : P2pLink::from_next;
    if (peer == (rank + size - 1) % size) return is_send ? P2pLink::to_prev : P2pLink::from_prev;
  }
  const bool upward = is_send ? peer > rank : peer < rank;
  return upward ? P2pLink::up : P2pLink::down;
}

}  // namespace loom::comm
