// Where a training run writes (train/run.cpp): every output location is
// created and written to before the first step, so that a bad path fails now
// and not after the last step; the directories the run writes into are
// locked for it; a file the run would replace must be one a run wrote.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/dir_lock.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

struct RunOutputs {
  std::string out_dir;  // where the final model goes; "" = nowhere
  std::vector<std::unique_ptr<DirLock>> locks;
};

// Every rank writes into checkpoint.dir and log.trace's directory, rank 0 of
// the mesh (lead) the rest.
RunOutputs prepare_outputs(const RunConfig& cfg, const TrainOptions& options, bool lead);

}  // namespace loom::train
