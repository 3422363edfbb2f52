#include "plan/serve_plan.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/paged_runner.h"
#include "model/params.h"

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The decode bound of S sequences at a mean context: tokens/s and the step's bytes.
std::pair<double, int64_t> decode_bound(const ServeRequest& r, int64_t S, int64_t kv_per_token) {
  const double context = static_cast<double>(r.input_len) + static_cast<double>(r.output_len) / 2;
  const auto bytes = model::decode_weight_bytes(r.model, r.weights, nullptr, S) +
                     static_cast<int64_t>(static_cast<double>(S) * context * static_cast<double>(kv_per_token));
  return {static_cast<double>(S) * r.cluster.memory_bandwidth / static_cast<double>(bytes), bytes};
}

}  // namespace

ServePlan plan_serving(const ServeRequest& r) {
  LOOM_REQUIRE(r.input_len >= 1 && r.output_len >= 1, "loom plan --serve: --input-len ", r.input_len,
               " and --output-len ", r.output_len, " must be >= 1");
  LOOM_REQUIRE(r.block_size >= 1, "loom plan --serve: --block-size ", r.block_size, " must be >= 1");
  LOOM_REQUIRE(r.reserve_bytes >= 0, "loom plan --serve: the reserve must be >= 0 bytes");
  LOOM_REQUIRE(r.input_len + r.output_len <= r.model.max_seq_len, "loom plan --serve: --input-len ", r.input_len,
               " + --output-len ", r.output_len, " exceeds the model's max_seq_len = ", r.model.max_seq_len);
  ServePlan p;
  p.weight_bytes = model::param_count(r.model) * static_cast<int64_t>(dtype_size(r.weights));
  p.kv_bytes_per_token = model::kv_block_bytes(r.model, 1, r.kv);
  const double free = r.cluster.memory_bytes - static_cast<double>(p.weight_bytes) - r.reserve_bytes;
  const int64_t block = model::kv_block_bytes(r.model, r.block_size, r.kv);
  p.kv_blocks = free > 0 ? static_cast<int64_t>(free / static_cast<double>(block)) : 0;
  p.sequences_at_once = p.kv_blocks / ceil_div(r.input_len + r.output_len, r.block_size);
  p.sequences_on_average = p.kv_blocks / ceil_div(r.input_len + r.output_len / 2, r.block_size);
  std::tie(p.decode_one, p.decode_step_bytes_one) = decode_bound(r, 1, p.kv_bytes_per_token);
  if (p.sequences_at_once > 0)
    std::tie(p.decode_full, p.decode_step_bytes_full) = decode_bound(r, p.sequences_at_once, p.kv_bytes_per_token);
  return p;
}

std::string serve_plan_table(const ServePlan& p, const ServeRequest& r) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "serving on one device of %s (%.1f GiB, %.4g GB/s):\n"
                "weights %.3f GiB (%s); KV cache %lld bytes per token (%s), %lld blocks of %lld tokens\n"
                "sequences of %lld + %lld tokens: %lld at once (each at its longest), %lld on average\n"
                "decode bound: %.4g tokens/s for one sequence, %.4g tokens/s for %lld together "
                "(memory bandwidth over the bytes a step reads: %.4g MB, %.4g MB)\n",
                r.cluster.name.c_str(), r.cluster.memory_bytes / kGiB, r.cluster.memory_bandwidth / 1e9,
                static_cast<double>(p.weight_bytes) / kGiB, std::string(dtype_name(r.weights)).c_str(),
                static_cast<long long>(p.kv_bytes_per_token), std::string(dtype_name(r.kv)).c_str(),
                static_cast<long long>(p.kv_blocks), static_cast<long long>(r.block_size),
                static_cast<long long>(r.input_len), static_cast<long long>(r.output_len),
                static_cast<long long>(p.sequences_at_once), static_cast<long long>(p.sequences_on_average),
                p.decode_one, p.decode_full, static_cast<long long>(p.sequences_at_once),
                static_cast<double>(p.decode_step_bytes_one) / 1e6, static_cast<double>(p.decode_step_bytes_full) / 1e6);
  std::string out = buf;
  if (p.kv_blocks == 0) out += "the weights (and reserve) leave no room for a KV block on this device\n";
  return out;
}

std::string serve_plan_json(const ServePlan& p) {
  return nlohmann::ordered_json({{"weight_bytes", p.weight_bytes},
                                 {"kv_bytes_per_token", p.kv_bytes_per_token},
                                 {"kv_blocks", p.kv_blocks},
                                 {"sequences_at_once", p.sequences_at_once},
                                 {"sequences_on_average", p.sequences_on_average},
                                 {"decode_bound_one_tokens_per_s", p.decode_one},
                                 {"decode_bound_full_tokens_per_s", p.decode_full}})
             .dump() +
         "\n";
}

}  // namespace loom::plan
