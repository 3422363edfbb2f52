// A training run on a given device, as `loom train --device` makes it: the
// tiny run of tiny_run.h through run_training in a one-process context whose
// pools live on that device. Shared by the device-plumbing test (the CPU's
// kernels registered as a second device: tests/train/test_device_emulated.cpp)
// and the GPU test (tests/gpu/cuda_train.cpp), which compare what a run on a
// device gives with the same run on the host.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mesh/context.h"
#include "model/config_json.h"
#include "model/params.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

struct DeviceRun {
  std::vector<double> losses;      // per step
  std::vector<double> grad_norms;  // per step
  std::vector<double> val_losses;  // the evaluations after steps, in order
  std::vector<float> model;        // the exported model's weights (out_dir/model.safetensors)
};

// The weights of a model directory written by loom train.
inline std::vector<float> model_weights(const std::filesystem::path& dir) {
  const model::ModelDir m = model::load_model_dir(dir.string());
  std::vector<float> w(static_cast<size_t>(model::param_count(model::param_specs(m.config))));
  model::load_model_params(m, Tensor(w.data(), DType::f32, {static_cast<int64_t>(w.size())}));
  return w;
}

// Runs cfg (its own checkpoint settings: resume, every) on `device` and
// writes the final model to out_dir.
inline DeviceRun run_on(const RunConfig& cfg, Device device, const std::filesystem::path& out_dir) {
  TrainOptions options;
  options.progress = false;
  options.out_dir = out_dir.string();
  mesh::LocalContext local({}, device);
  const TrainSummary s = run_training(cfg, options, local.ctx());
  DeviceRun r;
  for (const StepStats& st : s.steps) {
    r.losses.push_back(st.loss);
    r.grad_norms.push_back(st.grad_norm);
    if (st.val_loss) r.val_losses.push_back(*st.val_loss);
  }
  if (std::filesystem::exists(out_dir / "model.safetensors")) r.model = model_weights(out_dir);
  return r;
}

// A run of cfg's config saved at step 10 on first_on, then resumed to step
// 20 on then_on (checkpoints under dir/name): its 20 losses and final model.
inline DeviceRun checkpoint_chain(const RunConfig& cfg, const std::filesystem::path& dir, const std::string& name,
                                  Device first_on, Device then_on) {
  RunConfig first = cfg;
  first.checkpoint.dir = (dir / name).string();
  first.checkpoint.every = 10;
  first.train.steps = 10;
  DeviceRun a = run_on(first, first_on, dir / (name + "_a"));
  RunConfig second = first;
  second.train.steps = 20;
  const DeviceRun b = run_on(second, then_on, dir / (name + "_b"));
  a.losses.insert(a.losses.end(), b.losses.begin(), b.losses.end());
  a.model = b.model;
  return a;
}

}  // namespace loom::train
