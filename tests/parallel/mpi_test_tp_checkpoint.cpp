// Checkpoints under tensor parallelism (train/checkpoint.h): a run saved at
// one tp size resumes at another (and at another dp size and ZeRO stage at
// the same time) with the losses the uninterrupted run has, and a damaged tp
// shard is refused on every rank with the file named.
//
// Layouts run on the first dp x tp ranks of the world; the other ranks wait
// at the broadcast of the results. A layout too large for the world is
// skipped: at N = 1 only the tp = 1 cases run.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/threads.h"
#include "parallel/dp_run.h"
#include "train/checkpoint.h"
#include "common/run_context.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using train::RunConfig;
using train::Trainer;

constexpr int64_t kSteps = 20, kSaveAt = 10;
// As in mpi_test_dp.cpp: fp32 runs of another reduction order (here the tp
// sums of partial GEMMs, the vocab-parallel log-sum-exp) agree to rounding,
// which grows slowly over 20 smooth steps. 1e-5 is what the issue asks for.
constexpr double kTolerance = 1e-5;
constexpr int64_t kGlobalBatch = 4;  // sequences per step: a multiple of every dp size below

// Where a run trains: dp x tp ranks (tp fastest, as mesh/layout.h orders
// them) at the start of the world, and its ZeRO stage.
struct Layout {
  int dp = 1, tp = 1;
  int zero_stage = 0;

  int ranks() const { return dp * tp; }
  std::string name() const {
    return "tp=" + std::to_string(tp) + " dp=" + std::to_string(dp) + " zero_stage=" + std::to_string(zero_stage);
  }
};

// This rank's groups for a layout (dp_run.h sub_mesh).
SubMesh groups_of(const Layout& l) { return sub_mesh(1, l.dp, l.tp); }

class TpCheckpointTest : public SharedDataTest<"loom_mpi_tp_ckpt", 4000> {
 protected:
  // A GPT-2 whose heads (12) and hidden units split at tp = 2, 3 and 4, with
  // a vocabulary (512) that tp = 3 pads to 513 rows.
  static RunConfig config_of(const Layout& l) {
    RunConfig c = dp_config(dir_, l.dp, l.zero_stage, kGlobalBatch / l.dp, 1);
    c.model.n_layer = 2;
    c.model.n_head = c.model.n_kv_head = 12;
    c.model.n_embd = 96;
    c.model.d_ff = 384;
    c.model.vocab_size = 512;
    c.model.max_seq_len = 64;
    c.parallel.tp = l.tp;
    return c;
  }

  static bool fits(const Layout& l) { return l.ranks() <= world().size(); }

  // Layout l trains from scratch (resume_dir empty) or from resume_dir up to
  // kSteps, saving under save_root after kSaveAt steps if given: the losses
  // of the steps it ran, on every rank.
  static std::vector<double> run(const Layout& l, const fs::path& resume_dir, const fs::path& save_root = {}) {
    const SubMesh g = groups_of(l);
    std::vector<double> losses;
    if (g.member) {
      Trainer t(config_of(l), g.ctx());
      if (!resume_dir.empty()) {
        EXPECT_EQ(train::load_checkpoint(t, resume_dir.string()), kSaveAt) << l.name();
        if (l.zero_stage == 0) expect_padding_is_zero(t, l);
      }
      if (!save_root.empty()) {
        losses = losses_of(train_until(t, kSaveAt));
        train::save_checkpoint(t, save_root.string(), 0);
      }
      const std::vector<double> rest = losses_of(train_until(t, kSteps));
      losses.insert(losses.end(), rest.begin(), rest.end());
    }
    const size_t n = resume_dir.empty() ? kSteps : kSteps - kSaveAt;
    return broadcast_values(world(), losses, n);
  }

  // The vocabulary rows past the real ones (tp = 3: row 512 on tp rank 2)
  // hold no saved element: loaded, they must be 0 as init made them.
  static void expect_padding_is_zero(Trainer& t, const Layout& l) {
    const float* master = t.model().master_params().data_as<float>();
    for (const model::ParamSpec& spec : t.model().param_specs())
      for (const model::ShardRun& run : model::shard_runs(spec))
        for (int64_t i = 0; run.global < 0 && i < run.count; ++i)
          ASSERT_EQ(master[spec.offset + run.local + i], 0.f) << spec.name << " padding at " << l.name();
  }

  // The uninterrupted single-process run's 20 losses, computed once.
  static const std::vector<double>& single_process() {
    if (single_.empty()) single_ = run(Layout{}, {});
    return single_;
  }

  static std::vector<double> last_steps(const std::vector<double>& all) {
    return std::vector<double>(all.begin() + kSaveAt, all.end());
  }

  // Saved at `from` after 10 steps, its run continued to 20 (the
  // uninterrupted run of that layout), then resumed at each layout of `to`
  // that fits the world: steps 11-20 match both the uninterrupted run and
  // the single process.
  void expect_resumes_continue(const Layout& from, const std::vector<Layout>& to, const std::string& root_name) {
    const fs::path root = dir_ / root_name;
    const std::vector<double> straight = run(from, {}, root);
    const std::vector<double> one = single_process();
    const double from_diff = max_relative_difference(straight, one);
    report_difference("tp checkpoint", "uninterrupted " + from.name() + " vs one process", from_diff);
    EXPECT_LE(from_diff, kTolerance) << from.name() << " does not train like one process";
    const fs::path step_dir = root / train::checkpoint_step_dir_name(kSaveAt);
    for (const Layout& l : to) {
      if (!fits(l)) continue;
      const std::vector<double> resumed = run(l, step_dir);
      const double diff = max_relative_difference(resumed, last_steps(straight));
      const double diff_one = max_relative_difference(resumed, last_steps(one));
      report_difference("tp checkpoint", "saved at " + from.name() + ", steps 11-20 resumed at " + l.name(), diff);
      // The same layout continues bitwise (train/checkpoint.h).
      if (l.dp == from.dp && l.tp == from.tp && l.zero_stage == from.zero_stage) {
        EXPECT_EQ(resumed, last_steps(straight)) << "resumed at the layout it was saved at, " << l.name();
      }
      EXPECT_LE(diff, kTolerance) << "saved at " << from.name() << ", resumed at " << l.name();
      EXPECT_LE(diff_one, kTolerance) << "saved at " << from.name() << ", resumed at " << l.name() << " vs one process";
    }
  }

  static std::vector<double> single_;
};

std::vector<double> TpCheckpointTest::single_;

// The case: saved at tp = 2, resumed alone, at tp = 3 (the
// vocabulary padded to 513 rows: the padding row is no saved element), at
// tp = 4, and at dp = 2 x tp = 2 under ZeRO-1; and at tp = 2 itself.
TEST_F(TpCheckpointTest, SavedAtTp2ResumesAtTp1Tp3Tp4AndDp2Tp2WithTheSameLosses) {
  const Layout tp2{1, 2, 0};
  if (!fits(tp2)) GTEST_SKIP() << "a tp = 2 run needs 2 ranks; the world has " << world().size();
  expect_resumes_continue(tp2, {Layout{1, 1, 0}, Layout{1, 3, 0}, Layout{1, 4, 0}, Layout{2, 2, 1}, tp2},
                          "ckpt_tp2");
}

// The other way: a checkpoint of one process resumes at tp = 2 (and, where
// the world allows, at tp = 3 and at dp = 2 x tp = 2 under ZeRO-3); at N = 1
// it resumes alone.
TEST_F(TpCheckpointTest, SavedAtTp1ResumesAtTp2Tp3AndDp2Tp2Zero3) {
  expect_resumes_continue(Layout{}, {Layout{}, Layout{1, 2, 0}, Layout{1, 3, 0}, Layout{2, 2, 3}}, "ckpt_tp1");
}

// Saved from a padded layout (tp = 3 with ZeRO-2 over dp = 1): the padding
// rows are dropped, the rest resumes at tp = 2 and alone.
TEST_F(TpCheckpointTest, SavedAtTp3WithVocabPaddingResumesAtTp2AndAlone) {
  const Layout tp3{1, 3, 2};
  if (!fits(tp3)) GTEST_SKIP() << "a tp = 3 run needs 3 ranks; the world has " << world().size();
  expect_resumes_continue(tp3, {Layout{1, 2, 0}, Layout{}}, "ckpt_tp3");
}

// Format 2 (before tensor parallelism) has no tp_rank, global_shape, split
// or global_numel: it reads as a tp = 1 checkpoint, also at tp = 2.
TEST_F(TpCheckpointTest, Format2CheckpointResumesAsTp1) {
  const fs::path root = dir_ / "ckpt_format2";
  const std::vector<double> one = single_process();
  on_rank_zero([&] {
    TrainerOn one_process(config_of(Layout{}), nullptr);
    train_until(one_process.t, kSaveAt);
    const fs::path step_dir = train::save_checkpoint(one_process.t, root.string(), 0);
    const fs::path manifest = step_dir / train::kCheckpointManifestFile;
    nlohmann::ordered_json m = nlohmann::ordered_json::parse(std::ifstream(manifest));
    m["format_version"] = 2;
    m["parameters"].erase("global_numel");
    for (auto& [name, tensor] : m["parameters"]["tensors"].items()) tensor.erase("global_shape"), tensor.erase("split");
    for (auto& shard : m["shards"]) shard.erase("tp_rank"), shard.erase("dp_rank");
    std::ofstream(manifest, std::ios::trunc) << m.dump(2);
  });
  const fs::path step_dir = root / train::checkpoint_step_dir_name(kSaveAt);
  for (const Layout& l : {Layout{}, Layout{1, 2, 0}}) {
    if (!fits(l)) continue;
    const double diff = max_relative_difference(run(l, step_dir), last_steps(one));
    report_difference("tp checkpoint", "format 2 checkpoint, steps 11-20 resumed at " + l.name(), diff);
    EXPECT_LE(diff, kTolerance) << l.name();
  }
}

// The manifest of a dp = 2 x tp = 2 run: the tp size, one file per (tp, dp)
// rank named by its world rank, and every tensor's global shape and split.
TEST_F(TpCheckpointTest, ManifestRecordsTpSizeAndEveryTpRanksShards) {
  const Layout l{2, 2, 1};
  if (!fits(l)) GTEST_SKIP() << "dp = 2 x tp = 2 needs 4 ranks; the world has " << world().size();
  const fs::path root = dir_ / "ckpt_manifest";
  save_after_steps(groups_of(l), config_of(l), 1, root);
  if (world().rank() != 0) return;
  std::ifstream in(root / train::checkpoint_step_dir_name(1) / train::kCheckpointManifestFile);
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m["format_version"], train::kCheckpointFormatVersion);
  EXPECT_EQ(m["mesh"]["tp"], 2);
  EXPECT_EQ(m["mesh"]["dp"], 2);
  ASSERT_EQ(m["shards"].size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const nlohmann::json& s = m["shards"][rank / 2 + 2 * (rank % 2)];  // listed tp rank by tp rank
    EXPECT_EQ(s["file"], train::checkpoint_rank_file_name(s["dp_rank"].get<int>() * 2 + s["tp_rank"].get<int>()));
    EXPECT_TRUE(fs::exists(root / train::checkpoint_step_dir_name(1) / s["file"].get<std::string>()));
  }
  const nlohmann::json& wte = m["parameters"]["tensors"]["wte.weight"];
  EXPECT_EQ(wte["global_shape"], nlohmann::json::array({512, 96}));
  EXPECT_EQ(wte["shape"], nlohmann::json::array({256, 96}));
  EXPECT_EQ(wte["split"], nlohmann::json::array({0, 1, 512}));
  EXPECT_EQ(m["parameters"]["tensors"]["h.0.attn.c_proj.weight"]["split"], nlohmann::json::array({1, 1, 96}));
  EXPECT_EQ(m["files"].size(), 4u);
}

// A tp = 2 checkpoint whose tp rank 1 file is corrupted, then missing: a
// resume at tp = 2 (where rank 1 alone digests that file) and alone throws
// on every rank of the run, naming the file.
TEST_F(TpCheckpointTest, DamagedTpShardIsRefusedOnEveryRankNamingTheFile) {
  const Layout tp2{1, 2, 0};
  if (!fits(tp2)) GTEST_SKIP() << "a tp = 2 run needs 2 ranks; the world has " << world().size();
  const fs::path root = dir_ / "ckpt_damaged";
  save_after_steps(groups_of(tp2), config_of(tp2), 2, root);
  const fs::path step_dir = root / train::checkpoint_step_dir_name(2);
  const std::string file = train::checkpoint_rank_file_name(1);
  auto expect_refused = [&](const std::string& damage, const std::string& expected) {
    for (const Layout& at : {tp2, Layout{}}) {
      const SubMesh g = groups_of(at);
      if (!g.member) continue;
      Trainer t(config_of(at), g.ctx());
      try {
        train::load_checkpoint(t, step_dir.string());
        ADD_FAILURE() << damage << ", resumed at " << at.name() << ": no error";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(file + "' " + expected), std::string::npos)
            << damage << ", resumed at " << at.name() << ": " << msg;
      }
      EXPECT_EQ(t.steps_done(), 0) << "a refused checkpoint leaves the trainer as it was";
    }
    world().barrier()->wait();
  };
  on_rank_zero([&] {
    std::fstream f(step_dir / file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(step_dir / file) / 2));
    const char byte = static_cast<char>(f.peek() ^ 0x01);
    f.seekp(static_cast<std::streamoff>(fs::file_size(step_dir / file) / 2));
    f.put(byte);
  });
  expect_refused("one byte of tp rank 1's file flipped", "is corrupted: its sha256 is");
  on_rank_zero([&] { fs::remove(step_dir / file); });
  expect_refused("tp rank 1's file removed", "is missing");
}

}  // namespace
}  // namespace loom::test
