#include "parallel/ep.h"

#include <chrono>
#include <vector>

#include "comm/host_values.h"
#include "core/error.h"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

ExpertParallel::ExpertParallel(comm::Communicator& ep, bool overlap) : ep_(ep), overlap_(overlap) {}

void ExpertParallel::exchange_counts(Tensor out, const Tensor& in) {
  const auto start = Clock::now();
  LOOM_CHECK(in.dtype() == DType::i64 && in.numel() % ep_.size() == 0, "exchange_counts: ", in.str());
  ep_.all_to_all(out, in)->wait();
  seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void ExpertParallel::start_rows(Tensor out, std::span<const int64_t> recv_rows, const Tensor& in,
                                std::span<const int64_t> send_rows) {
  const auto start = Clock::now();
  const int P = ep_.size();
  LOOM_CHECK(!started_, "start_rows: an exchange is already in flight");
  LOOM_CHECK(static_cast<int>(recv_rows.size()) == P && static_cast<int>(send_rows.size()) == P &&
                 in.ndim() == 2 && out.ndim() == 2 && in.size(1) == out.size(1) && in.dtype() == out.dtype(),
             "start_rows: ", out.str(), " <- ", in.str());
  const int64_t width = in.size(1);
  std::vector<int64_t> recv(static_cast<size_t>(P)), send(static_cast<size_t>(P));
  int64_t recv_total = 0, send_total = 0;
  for (int r = 0; r < P; ++r) {
    recv[static_cast<size_t>(r)] = recv_rows[static_cast<size_t>(r)] * width;
    send[static_cast<size_t>(r)] = send_rows[static_cast<size_t>(r)] * width;
    recv_total += recv_rows[static_cast<size_t>(r)], send_total += send_rows[static_cast<size_t>(r)];
  }
  LOOM_CHECK(recv_total <= out.size(0) && send_total <= in.size(0), "start_rows: ", recv_total, " rows into ",
             out.str(), ", ", send_total, " from ", in.str());
  // An all_to_all only copies: f16 rows travel as bf16 bits (comm::copy_view).
  const Tensor o = comm::copy_view(out).slice(0, 0, recv_total).flatten();
  const Tensor i = comm::copy_view(in).slice(0, 0, send_total).flatten();
  rows_ = ep_.all_to_all_v(o, recv, i, send);
  started_ = true;
  if (!overlap_) rows_->wait(), rows_ = nullptr;
  bytes_ += send_total * width * static_cast<int64_t>(dtype_size(in.dtype()));
  seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void ExpertParallel::finish_rows() {
  const auto start = Clock::now();
  LOOM_CHECK(started_, "finish_rows: no exchange in flight");
  started_ = false;
  if (!rows_) return;  // not overlapped: start_rows waited
  comm::WorkPtr work = std::move(rows_);
  rows_ = nullptr;
  work->wait();
  seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

// Host values (the gathered choices of cp_capacity) go through the
// device's buffers where the communicator is a device's (host_values.h).
void RoutingGroups::all_gather(Tensor out, const Tensor& in) {
  if (in.device().is_cpu()) return comm::all_gather_host(cp_, out, in);
  cp_.all_gather(out, in)->wait();
}

void RoutingGroups::all_reduce_sum(Tensor t) {
  if (t.device().is_cpu()) return comm::all_reduce_host(cp_, t, comm::ReduceOp::sum);
  cp_.all_reduce(t, comm::ReduceOp::sum)->wait();
}

}  // namespace loom::parallel
