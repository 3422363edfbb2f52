// Checkpoints under context parallelism (train/checkpoint.h): the cp ranks
// hold ZeRO shards of the dp x cp group, and a run saved at one cp resumes
// at another (and at another tp, dp and ZeRO stage) with the losses the
// uninterrupted run has: cp 2 -> cp 1, cp 1 -> cp 4, cp 2 x tp 2 -> cp 4.
//
// Layouts run on the first dp x cp x tp ranks of the world; the others wait
// at the broadcast of the results. A layout too large for the world is
// skipped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/dp_run.h"
#include "train/checkpoint.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using train::RunConfig;
using train::Trainer;

constexpr int64_t kSteps = 20, kSaveAt = 10;
constexpr double kTolerance = 1e-5;  // the bound, fp32
constexpr int64_t kGlobalBatch = 4;  // sequences per step

struct Layout {
  int dp = 1, cp = 1, tp = 1;
  int zero_stage = 0;
  int ranks() const { return dp * cp * tp; }
  std::string name() const { return concat("dp=", dp, " cp=", cp, " tp=", tp, " zero_stage=", zero_stage); }
};

class CpCheckpointTest : public SharedDataTest<"loom_mpi_cp_ckpt", 4000> {
 protected:
  // A GPT-2 whose 12 heads split at tp = 2; 48-token sequences split into
  // 2 x cp zig-zag chunks for cp = 2 and 4.
  static RunConfig config_of(const Layout& l) {
    RunConfig c = dp_config(dir_, l.dp, l.zero_stage, kGlobalBatch / l.dp, 1);
    c.model.n_layer = 2, c.model.n_head = c.model.n_kv_head = 12, c.model.n_embd = 96, c.model.d_ff = 384;
    c.model.vocab_size = 512, c.model.max_seq_len = 64;
    c.train.seq_len = 48;
    c.parallel.cp = l.cp, c.parallel.tp = l.tp;
    return c;
  }
  static bool fits(const Layout& l) { return l.ranks() <= world().size(); }

  // Trains l from scratch (resume_dir empty) or from resume_dir to kSteps,
  // saving under save_root after kSaveAt steps if given: the losses of the
  // steps it ran, on every rank.
  static std::vector<double> run(const Layout& l, const fs::path& resume_dir, const fs::path& save_root = {}) {
    return run_resumable(sub_mesh(1, l.dp, l.tp, l.cp), config_of(l), kSaveAt, kSteps, resume_dir, save_root, l.name());
  }

  static std::vector<double> last_steps(const std::vector<double>& all) {
    return std::vector<double>(all.begin() + kSaveAt, all.end());
  }

  // Saved at `from` after 10 steps and continued (the uninterrupted run),
  // then resumed at each layout of `to` that fits: steps 11-20 match the
  // uninterrupted run (bitwise at the layout it was saved at).
  void expect_resumes_continue(const Layout& from, const std::vector<Layout>& to, const std::string& root_name) {
    const fs::path root = dir_ / root_name;
    const std::vector<double> straight = run(from, {}, root);
    const fs::path step_dir = root / train::checkpoint_step_dir_name(kSaveAt);
    for (const Layout& l : to) {
      if (!fits(l)) continue;
      const std::vector<double> resumed = run(l, step_dir);
      const double diff = max_relative_difference(resumed, last_steps(straight));
      report_difference("cp checkpoint", "saved at " + from.name() + ", steps 11-20 resumed at " + l.name(), diff);
      if (l.dp == from.dp && l.cp == from.cp && l.tp == from.tp && l.zero_stage == from.zero_stage) {
        EXPECT_EQ(resumed, last_steps(straight)) << "resumed at the layout it was saved at, " << l.name();
      }
      EXPECT_LE(diff, kTolerance) << "saved at " << from.name() << ", resumed at " << l.name();
    }
  }
};

TEST_F(CpCheckpointTest, SavedAtCp2ResumesAloneAndAtCp2) {
  const Layout cp2{1, 2, 1, 1};
  if (!fits(cp2)) GTEST_SKIP() << "a cp = 2 run needs 2 ranks; the world has " << world().size();
  expect_resumes_continue(cp2, {Layout{}, cp2}, "ckpt_cp2");
}

TEST_F(CpCheckpointTest, SavedAloneResumesAtCp4) {
  if (!fits(Layout{1, 4})) GTEST_SKIP() << "a cp = 4 run needs 4 ranks; the world has " << world().size();
  expect_resumes_continue(Layout{}, {Layout{1, 4}}, "ckpt_cp1");
}

TEST_F(CpCheckpointTest, SavedAtCp2Tp2ResumesAtCp4AndAtDp2Cp2Zero3) {
  const Layout cp2tp2{1, 2, 2, 0};
  if (!fits(cp2tp2)) GTEST_SKIP() << "a cp = 2 x tp = 2 run needs 4 ranks; the world has " << world().size();
  expect_resumes_continue(cp2tp2, {Layout{1, 4}, Layout{2, 2, 1, 3}}, "ckpt_cp2tp2");
}

// The manifest says the mesh (dp and cp apart) and names each shard's file
// by the world rank that wrote it.
TEST_F(CpCheckpointTest, ManifestRecordsCpAndEveryCpRanksShard) {
  const Layout l{2, 2, 1, 1};
  if (!fits(l)) GTEST_SKIP() << "dp = 2 x cp = 2 needs 4 ranks; the world has " << world().size();
  const fs::path root = dir_ / "ckpt_manifest";
  run(l, {}, root);
  on_rank_zero([&] {
    const nlohmann::json m = nlohmann::json::parse(
        std::ifstream(root / train::checkpoint_step_dir_name(kSaveAt) / train::kCheckpointManifestFile));
    EXPECT_EQ(m["mesh"]["dp"], 2);
    EXPECT_EQ(m["mesh"]["cp"], 2);
    ASSERT_EQ(m["shards"].size(), 4u);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(m["shards"][r]["rank"], r);
      EXPECT_EQ(m["shards"][r]["dp_rank"], r / 2);
      EXPECT_EQ(m["shards"][r]["cp_rank"], r % 2);
    }
  });
}

}  // namespace
}  // namespace loom::test
