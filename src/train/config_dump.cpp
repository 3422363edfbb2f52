// run_config_to_json (train/config.h): every key of a run's config, as a
// run records it beside its checkpoints and metrics.
#include <nlohmann/json.hpp>

#include "model/config_json.h"
#include "train/config.h"

namespace loom::train {

namespace {

nlohmann::ordered_json parallel_json(const ParallelConfig& p) {
  return {{"dp", p.dp},
          {"tp", p.tp},
          {"pp", p.pp},
          {"cp", p.cp},
          {"cp_algo", p.cp_algo},
          {"ep", p.ep},
          {"ep_overlap", p.ep_overlap},
          {"zero_stage", p.zero_stage},
          {"sequence_parallel", p.sequence_parallel},
          {"pp_schedule", p.pp_schedule},
          {"virtual_stages", p.virtual_stages},
          {"pp_layers", p.pp_layers},
          {"bucket_mb", p.bucket_mb},
          {"offload_optimizer", p.offload_optimizer},
          {"offload", p.offload},
          {"offload_dir", p.offload_dir},
          {"offload_budget_mb", p.offload_budget_mb},
          {"offload_direct", p.offload_direct},
          {"comm_algo", p.comm_algo},
          {"timeout_s", p.timeout_s},
          {"mode", p.mode},
          {"ps_servers", p.ps_servers},
          {"ps_server", p.ps_server},
          {"staleness", p.staleness}};
}

}  // namespace

nlohmann::ordered_json run_config_to_json(const RunConfig& c) {
  nlohmann::ordered_json j;
  j["model"] = model::model_config_to_json(c.model);
  j["data"] = {{"train", c.data.train}, {"val", c.data.val}, {"shuffle", c.data.shuffle}};
  const TrainConfig& t = c.train;
  j["train"] = {{"seq_len", t.seq_len},
                {"micro_batch", t.micro_batch},
                {"grad_accum", t.grad_accum},
                {"global_batch", t.global_batch},
                {"steps", t.steps},
                {"lr", t.lr},
                {"min_lr", t.min_lr},
                {"warmup_steps", t.warmup_steps},
                {"weight_decay", t.weight_decay},
                {"adam_beta1", t.adam_beta1},
                {"adam_beta2", t.adam_beta2},
                {"adam_eps", t.adam_eps},
                {"grad_clip", t.grad_clip},
                {"dtype", t.dtype},
                {"loss_scale", t.loss_scale},
                {"loss_scale_window", t.loss_scale_window},
                {"min_loss_scale", t.min_loss_scale},
                {"max_bad_steps", t.max_bad_steps},
                {"recompute", t.recompute},
                {"device", t.device},
                {"seed", t.seed},
                {"eval_every", t.eval_every},
                {"eval_steps", t.eval_steps}};
  j["parallel"] = parallel_json(c.parallel);
  j["checkpoint"] = {{"dir", c.checkpoint.dir},
                     {"every", c.checkpoint.every},
                     {"keep", c.checkpoint.keep},
                     {"resume", c.checkpoint.resume}};
  if (c.lora.adapters.enabled()) {
    const model::LoraConfig& l = c.lora.adapters;
    j["lora"] = {{"rank", l.rank}, {"alpha", l.alpha}, {"dropout", l.dropout}, {"targets", l.targets},
                 {"base", c.lora.base}, {"init", c.lora.init}};
  }
  j["log"] = {{"metrics", c.log.metrics}, {"every", c.log.every}, {"trace", c.log.trace},
              {"trace_ops", c.log.trace_ops}, {"peak_tflops", c.log.peak_tflops}};
  return j;
}

}  // namespace loom::train
