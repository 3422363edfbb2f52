#include "train/config.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config_agree.h"

namespace loom::train {
namespace {

const char* kMinimal = R"([model]
preset = "gpt2-tiny"
[data]
train = "train_*.bin"
val = "val_*.bin"
[train]
seq_len = 32
)";

// Parses and expects a loom::Error whose message contains every part.
void expect_error(const std::string& text, const std::vector<std::string>& overrides,
                  std::initializer_list<std::string> parts) {
  try {
    parse_run_config(text, "run.toml", overrides);
    FAIL() << "no error; expected one containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(RunConfig, ValidFileSetsEveryKeyOfEverySection) {
  const RunConfig c = parse_run_config(R"([model]
family = "llama"
n_layer = 3
n_embd = 96
n_head = 6
n_kv_head = 2
d_ff = 256
vocab_size = 1000
max_seq_len = 128
rope_theta = 500000.0
norm_eps = 1e-6
tie_embeddings = false
[data]
train = ["a.bin", "b_*.bin"]
val = "v.bin"
shuffle = false
[train]
seq_len = 64
micro_batch = 2
grad_accum = 4
steps = 50
lr = 1e-3
min_lr = 0
warmup_steps = 5
weight_decay = 0.0
grad_clip = 0.5
dtype = "fp32"
recompute = "none"
seed = 42
eval_every = 10
eval_steps = 3
[parallel]
dp = 1
zero_stage = 1
pp_schedule = "afab"
bucket_mb = 50
[checkpoint]
dir = "out"
every = 0
keep = 3
resume = "never"
[log]
metrics = "m.jsonl"
every = 5
)",
                                       "run.toml");
  EXPECT_EQ(c.model.family, model::Family::llama);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_FLOAT_EQ(c.model.rope_theta, 500000.f);
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.bin", "b_*.bin"}));
  EXPECT_EQ(c.data.val, std::vector<std::string>{"v.bin"});
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.train.grad_accum, 4);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 0.0);  // an integer is accepted for a float key
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_EQ(c.parallel.zero_stage, 1);
  EXPECT_EQ(c.parallel.pp_schedule, "afab");
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.checkpoint.resume, "never");
  EXPECT_EQ(c.log.metrics, "m.jsonl");
  EXPECT_EQ(c.log.every, 5);
}

TEST(RunConfig, AbsentKeysKeepTheDefaults) {
  const RunConfig c = parse_run_config(kMinimal, "run.toml");
  const TrainConfig d;
  EXPECT_DOUBLE_EQ(c.train.lr, d.lr);
  EXPECT_EQ(c.train.steps, d.steps);
  EXPECT_EQ(c.train.dtype, "fp32");
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_EQ(c.log.every, LogConfig{}.every);
}

TEST(RunConfig, ExplicitModelKeysOverrideThePresetInAnyOrder) {
  const RunConfig c = parse_run_config("[model]\nn_layer = 3\npreset = \"gpt2-tiny\"\nn_head = 8\n"
                                       "[data]\ntrain = \"t.bin\"\nval = \"v.bin\"\n[train]\nseq_len = 16\n",
                                       "run.toml");
  const model::ModelConfig tiny = model::model_preset("gpt2-tiny");
  EXPECT_EQ(c.model_preset, "gpt2-tiny");
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_embd, tiny.n_embd);
  EXPECT_EQ(c.model.n_head, 8);
  EXPECT_EQ(c.model.n_kv_head, 8);  // GPT-2: follows n_head
}

TEST(RunConfig, SetOverridesTheFileWithTypedValues) {
  const RunConfig c = parse_run_config(
      kMinimal, "run.toml",
      {"train.lr=3e-4", "train.steps=7", "data.train=data/x_*.bin", "data.val=[\"a.bin\", \"b.bin\"]",
       "model.tie_embeddings=false", "train.steps=9", "model.preset=llama-tiny"});
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.steps, 9);  // the later --set wins
  EXPECT_EQ(c.data.train, std::vector<std::string>{"data/x_*.bin"});
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"a.bin", "b.bin"}));
  EXPECT_EQ(c.model.family, model::Family::llama);
  EXPECT_FALSE(c.model.tie_embeddings);
}

// A rule across keys names the file and the --set overrides: the value it
// refuses may come from either.
TEST(RunConfigErrors, RulesAcrossKeysNameTheOverridesToo) {
  expect_error(kMinimal, {"train.seq_len=4096"},
               {"run.toml with --set train.seq_len=4096: train.seq_len = 4096 is invalid"});
  expect_error(kMinimal, {"train.steps=2", "train.seq_len=4096"},
               {"run.toml with --set train.steps=2, --set train.seq_len=4096: "});
}

TEST(RunConfigErrors, UnknownSectionNamesTheFileLineAndSection) {
  expect_error(std::string(kMinimal) + "[optimiser]\nlr = 1\n", {},
               {"run.toml:8", "unknown section [optimiser]", "[model], [data], [train]"});
}

TEST(RunConfigErrors, UnknownKeyNamesTheFileLineKeyAndAllowedKeys) {
  expect_error(std::string(kMinimal) + "learning_rate = 0.1\n", {},
               {"run.toml:8", "unknown key train.learning_rate", "seq_len, micro_batch"});
}

TEST(RunConfigErrors, UnknownKeyInSetNamesTheArgument) {
  expect_error(kMinimal, {"train.lrr=1"}, {"--set train.lrr=1", "unknown key train.lrr"});
  expect_error(kMinimal, {"lr=1"}, {"--set lr=1", "expected section.key=value"});
  expect_error(kMinimal, {"train.=3"}, {"--set train.=3", "the key after 'train.' is empty"});
  expect_error(kMinimal, {"model.=x"}, {"--set model.=x", "the key after 'model.' is empty"});
}

TEST(RunConfigErrors, WrongTypeNamesTheKeyValueAndAllowedValues) {
  expect_error(std::string(kMinimal) + "steps = \"ten\"\n", {},
               {"run.toml:8", "train.steps = 'ten' is invalid", "integers >= 1"});
  expect_error(kMinimal, {"train.steps=1.5"}, {"--set train.steps=1.5", "train.steps = 1.5", "integers >= 1"});
  expect_error(kMinimal, {"data.shuffle=yes"}, {"data.shuffle = 'yes'", "true, false"});
}

TEST(RunConfigErrors, OutOfRangeNamesTheKeyValueAndRange) {
  expect_error(kMinimal, {"train.lr=-0.1"}, {"train.lr = -0.1 is invalid", "numbers > 0"});
  expect_error(kMinimal, {"train.micro_batch=0"}, {"train.micro_batch = 0", "integers >= 1"});
  expect_error(kMinimal, {"parallel.zero_stage=4"}, {"parallel.zero_stage = 4", "integers from 0 to 3"});
  expect_error(kMinimal, {"parallel.pp_schedule=gpipe"}, {"'gpipe'", "afab, 1f1b, interleaved"});
  expect_error(kMinimal, {"train.seq_len=65"}, {"train.seq_len = 65", "model.max_seq_len = 64"});
  expect_error(kMinimal, {"train.min_lr=1"}, {"train.min_lr = 1", "<= train.lr"});
}

TEST(RunConfigErrors, FeaturesNotBuiltYetAreRejectedByName) {
  expect_error(kMinimal, {"train.dtype=fp8"}, {"train.dtype = 'fp8' is invalid", "fp32, bf16, fp16"});
  expect_error(kMinimal, {"train.loss_scale=0"}, {"train.loss_scale = 0 is invalid", "numbers > 0"});
  expect_error(kMinimal, {"train.recompute=some"}, {"train.recompute", "'some'", "none, selective, full"});
}

// Expert parallelism splits the dp ranks and the experts of a MoE model.
TEST(RunConfigErrors, ExpertParallelismSaysWhatMustDivideWhat) {
  expect_error(kMinimal, {"parallel.ep=2", "parallel.dp=2"}, {"parallel.ep = 2", "model.n_expert > 0"});
  const std::vector<std::string> moe = {"model.family=llama", "model.n_kv_head=4", "model.n_expert=4"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return more;
  };
  expect_error(kMinimal, with({"parallel.ep=2", "parallel.dp=3"}), {"parallel.ep = 2 does not divide parallel.dp = 3"});
  expect_error(kMinimal, with({"parallel.ep=3", "parallel.dp=3"}),
               {"parallel.ep = 3 does not divide model.n_expert = 4"});
  expect_error(kMinimal, with({"model.routing_group=3", "train.micro_batch=4"}),
               {"train.micro_batch = 4", "model.routing_group = 3"});
  expect_error(kMinimal, with({"model.top_k=5"}), {"model.top_k = 5", "model.n_expert = 4"});
  EXPECT_EQ(parse_run_config(kMinimal, "run.toml", with({"parallel.ep=2", "parallel.dp=4"})).parallel.ep, 2);
}

// parallel.offload (ZeRO-Infinity's disk tier): a directory, one way of
// offloading at a time, a budget the stream fits in, the parameters' tier
// over ZeRO-3's shards only.
// [lora] with only init names that key (it named lora.base, which was not
// set) and both keys that are needed.
TEST(RunConfigErrors, LoraWithoutARankNamesTheKeyThatIsSet) {
  expect_error(kMinimal, {"lora.init=/tmp/adapter"},
               {"lora.init is set but lora.rank is missing: [lora] needs rank and base"});
}

TEST(RunConfigErrors, OffloadNeedsADirAndABudgetAndParamsNeedZero3) {
  const std::string dir = "parallel.offload_dir=/tmp/loom-offload-config-test";
  expect_error(kMinimal, {"parallel.offload=optimizer"}, {"parallel.offload = optimizer needs parallel.offload_dir"});
  expect_error(kMinimal, {"parallel.offload=disk"}, {"parallel.offload", "'disk'", "none, optimizer, params"});
  expect_error(kMinimal, {"parallel.offload=params", dir, "parallel.zero_stage=2"},
               {"parallel.offload = params puts ZeRO-3's parameter and gradient shards on disk",
                "needs parallel.zero_stage = 3 (this run has 2)", "use parallel.offload = optimizer"});
  expect_error(kMinimal, {"parallel.offload=params", "parallel.zero_stage=3"},
               {"parallel.offload = params needs parallel.offload_dir"});
  EXPECT_EQ(parse_run_config(kMinimal, "run.toml", {"parallel.offload=params", dir, "parallel.zero_stage=3"})
                .parallel.offload,
            "params");
  expect_error(kMinimal, {"parallel.offload=optimizer", dir, "parallel.offload_optimizer=true"},
               {"with parallel.offload_optimizer", "set offload_optimizer = false"});
  expect_error(kMinimal, {"parallel.offload=optimizer", dir, "parallel.offload_budget_mb=0.1"},
               {"parallel.offload_budget_mb = 0.1: a budget of 104857 bytes is below the least",
                "4 buffers of 4096 elements x 2 f32 arrays (and 4 KiB to align them) = 135168 bytes", "raise it"});
  const RunConfig c = parse_run_config(kMinimal, "run.toml", {"parallel.offload=optimizer", dir});
  EXPECT_EQ(c.parallel.offload, "optimizer");
  EXPECT_EQ(c.parallel.offload_budget_mb, 64.0);
  EXPECT_TRUE(c.parallel.offload_direct);
}

// Context parallelism cuts every sequence into 2 x cp zig-zag chunks.
TEST(RunConfigErrors, ContextParallelSequencesThatDoNotSplitSayWhatMustDivide) {
  expect_error(kMinimal, {"parallel.cp=3", "train.seq_len=16"},
               {"train.seq_len = 16 cannot be split over cp = 3 in zig-zag order", "multiple of 6"});
  expect_error(kMinimal, {"parallel.cp_algo=ulysses"}, {"parallel.cp_algo", "'ulysses'", "ring, allgather"});
  // SP splits each cp rank's share of a sequence over tp: 24 = 2 x cp 4 chunks, but 6 tokens a rank over tp 4.
  expect_error(kMinimal, {"parallel.cp=4", "parallel.tp=4", "parallel.sequence_parallel=true", "train.seq_len=24"},
               {"train.seq_len = 24 is not divisible by parallel.tp = 4 x parallel.cp = 4", "multiple of tp x cp"});
}

// gpt2-tiny: 2 layers, tied embeddings. Pipeline stages need layers, the
// schedule must fit the micro-batches, and ZeRO stays at 0 / 1.
TEST(RunConfigErrors, PipelineShapesThatCannotRunSayWhy) {
  expect_error(kMinimal, {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=interleaved"},
               {"parallel.pp x parallel.virtual_stages = 4 stages for model.n_layer = 2 layers"});
  expect_error(kMinimal, {"parallel.virtual_stages=2"}, {"parallel.virtual_stages = 2 needs parallel.pp > 1"});
  expect_error(kMinimal, {"parallel.pp=2", "model.n_layer=4", "parallel.virtual_stages=2",
                          "parallel.pp_schedule=interleaved", "train.grad_accum=3"},
               {"parallel.pp_schedule = interleaved", "train.grad_accum = 3"});
  expect_error(kMinimal, {"parallel.pp=2", "parallel.zero_stage=2"}, {"ZeRO stages 0 and 1"});
  expect_error(kMinimal, {"parallel.pp=2", "model.n_layer=6", "parallel.pp_layers=[2, 3]"},
               {"parallel.pp_layers sums to 5 layers but model.n_layer = 6"});
  expect_error(kMinimal, {"parallel.pp=2", "parallel.pp_layers=[1, 0]"}, {"integers >= 1"});
  expect_error(kMinimal, {"parallel.pp=2", "parallel.pp_layers=[2]"}, {"parallel.pp_layers has 1 entries", "2 stages"});
  const RunConfig ok = parse_run_config(kMinimal, "run.toml", {"parallel.pp=2", "parallel.pp_schedule=afab"});
  EXPECT_EQ(ok.parallel.pp, 2);
  // A tied embedding under pp composes with ZeRO-1 (its own dp bucket).
  EXPECT_EQ(parse_run_config(kMinimal, "run.toml", {"parallel.pp=2", "parallel.zero_stage=1"}).parallel.zero_stage, 1);
  const RunConfig manual =
      parse_run_config(kMinimal, "run.toml", {"parallel.pp=2", "model.n_layer=6", "parallel.pp_layers=[4, 2]"});
  EXPECT_EQ(manual.parallel.pp_layers, (std::vector<int64_t>{4, 2}));
}

// gpt2-tiny: 4 heads, d_ff 256, seq_len 32. tp must divide the heads (and
// KV heads, d_ff); SP must divide every sequence.
TEST(RunConfigErrors, TensorParallelShapesThatCannotSplitSayWhatMustDivideWhat) {
  expect_error(kMinimal, {"parallel.tp=3"}, {"run.toml", "parallel.tp = 3 does not divide model.n_head = 4"});
  expect_error(kMinimal, {"parallel.tp=2", "model.family=llama", "model.n_kv_head=1"},
               {"parallel.tp = 2 does not divide model.n_kv_head = 1"});
  expect_error(kMinimal, {"parallel.tp=4", "model.d_ff=258"}, {"parallel.tp = 4 does not divide model.d_ff = 258"});
  expect_error(kMinimal, {"parallel.tp=4", "parallel.sequence_parallel=true", "train.seq_len=30"},
               {"train.seq_len = 30 is not divisible by parallel.tp = 4", "sequence parallelism"});
  const RunConfig ok = parse_run_config(kMinimal, "run.toml", {"parallel.tp=4", "parallel.sequence_parallel=true"});
  EXPECT_EQ(ok.parallel.tp, 4);
  EXPECT_TRUE(ok.parallel.sequence_parallel);
}

TEST(RunConfigErrors, TraceOpsNeedsATraceFile) {
  expect_error(kMinimal, {"log.trace_ops=true"}, {"log.trace is missing but log.trace_ops = true"});
  expect_error(kMinimal, {"log.trace_ops=yes"}, {"log.trace_ops", "true, false"});
  EXPECT_TRUE(parse_run_config(kMinimal, "run.toml", {"log.trace_ops=true", "log.trace=t.json"}).log.trace_ops);
}

TEST(RunConfigErrors, CheckpointEveryNeedsADir) {
  expect_error(kMinimal, {"checkpoint.every=100"}, {"checkpoint.dir is missing but checkpoint.every = 100"});
  EXPECT_EQ(parse_run_config(kMinimal, "run.toml", {"checkpoint.every=100", "checkpoint.dir=ckpt"}).checkpoint.every,
            100);
}

// global_batch = dp x micro_batch x grad_accum sets grad_accum; a global
// batch that no whole grad_accum reaches names both sides of the product.
TEST(RunConfigErrors, GlobalBatchNotDivisibleByDpTimesMicroBatchNamesBoth) {
  const std::vector<std::string> dp4 = {"parallel.dp=4", "train.micro_batch=3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), dp4.begin(), dp4.end());
    return extra;
  };
  EXPECT_EQ(parse_run_config(kMinimal, "run.toml", with({"train.global_batch=24"})).train.grad_accum, 2);
  expect_error(kMinimal, with({"train.global_batch=30"}),
               {"--set train.global_batch=30", "train.global_batch = 30 is not divisible by",
                "parallel.dp x train.micro_batch = 4 x 3 = 12"});
  expect_error(kMinimal, with({"train.global_batch=24", "train.grad_accum=3"}),
               {"train.global_batch = 24", "needs train.grad_accum = 2", "train.grad_accum = 3"});
}

TEST(RunConfigErrors, InvalidModelAndPresetNameTheKey) {
  expect_error(kMinimal, {"model.n_head=5"}, {"run.toml", "model.n_embd = 64 is not divisible by model.n_head = 5"});
  expect_error(kMinimal, {"model.preset=gpt5"}, {"--set model.preset=gpt5", "gpt5", "gpt2-124m"});
}

TEST(RunConfigErrors, MissingDataAndBadTomlAndMissingFile) {
  expect_error("[train]\nseq_len = 8\n", {}, {"data.train is missing"});
  expect_error("[train]\nseq_len = = 8\n", {}, {"run.toml:2", "invalid TOML"});
  expect_error("steps = 3\n", {}, {"run.toml:1", "unknown key steps"});
  try {
    load_run_config("/nonexistent/run.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/run.toml' cannot be read"), std::string::npos);
  }
}

TEST(RunConfigErrors, DirectoryGivenAsConfigSaysATomlFileIsExpected) {
  const std::string dir = std::string(__FILE__).substr(0, std::string(__FILE__).rfind('/'));  // tests/train
  try {
    load_run_config(dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config '" + dir + "' is a directory: a TOML file is expected"),
              std::string::npos)
        << e.what();
  }
}

// Every numeric key has an upper bound, named in its error: past it a
// duration, a count or a product of them would overflow downstream (a
// timeout_s of 1e17 s once spun every rank forever at start-up).
TEST(RunConfigErrors, NumericKeysPastTheirUpperBoundNameTheBound) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"parallel.timeout_s=1e10", "parallel.timeout_s = 1e+10 is invalid: allowed values are numbers > 0 and <= 604800"},
      {"parallel.timeout_s=1e17", "numbers > 0 and <= 604800"},
      {"train.lr=1e300", "train.lr = 1e+300 is invalid: allowed values are numbers > 0 and <= 10"},
      {"train.min_lr=11", "train.min_lr = 11 is invalid: allowed values are numbers >= 0 and <= 10"},
      {"train.steps=1000000000000", "train.steps = 1000000000000 is invalid: allowed values are integers >= 1 and <= 1000000000"},
      {"train.warmup_steps=9223372036854775807", "integers >= 0 and <= 1000000000"},
      {"train.seq_len=100000000", "train.seq_len = 100000000 is invalid: allowed values are integers >= 1 and <= 16777216"},
      {"train.micro_batch=100000", "integers >= 1 and <= 65536"},
      {"train.grad_accum=2000000", "integers >= 1 and <= 1048576"},
      {"train.global_batch=2000000000000", "integers >= 0 and <= 1099511627776"},
      {"train.weight_decay=100", "numbers >= 0 and <= 10"},
      {"train.adam_beta2=1", "train.adam_beta2 = 1 is invalid: allowed values are numbers >= 0 and <= 0.999999"},
      {"train.adam_eps=0", "numbers > 0 and <= 1"},
      {"train.grad_clip=1e7", "numbers >= 0 and <= 1e+06"},
      {"train.loss_scale=1e30", "numbers > 0 and <= 1e+20"},
      {"train.loss_scale_window=2000000000", "integers >= 1 and <= 1000000000"},
      {"train.eval_every=2000000000", "integers >= 0 and <= 1000000000"},
      {"train.eval_steps=2000000", "integers >= 1 and <= 1000000"},
      {"checkpoint.every=2000000000", "checkpoint.every = 2000000000 is invalid: allowed values are integers >= 0 and <= 1000000000"},
      {"checkpoint.keep=2000000", "checkpoint.keep = 2000000 is invalid: allowed values are integers >= 0 and <= 1000000"},
      {"log.every=2000000000", "integers >= 1 and <= 1000000000"},
      {"log.peak_tflops=1e9", "numbers >= 0 and <= 1e+06"},
      {"parallel.bucket_mb=1e6", "parallel.bucket_mb = 1e+06 is invalid: allowed values are numbers > 0 and <= 65536"},
      {"parallel.virtual_stages=5000", "integers >= 1 and <= 4096"},
      {"parallel.pp_layers=[1, 5000]", "a non-empty array of integers >= 1 and <= 4096"},
      {"model.n_layer=5000", "model.n_layer = 5000 is invalid: allowed values are integers >= 1 and <= 4096"},
      {"model.rope_theta=1e13", "numbers > 0 and <= 1e+12"},
      {"model.n_expert=5000", "integers >= 0 and <= 4096"},
      {"model.capacity_factor=1e4", "numbers >= 0 and <= 1000"},
      {"model.router_score=relu", "softmax, sigmoid"},
      {"model.aux_free_rate=2", "numbers >= 0 and <= 1"},
      {"model.aux_loss_coef=1e3", "numbers >= 0 and <= 100"},
  };
  for (const auto& [set, message] : cases) expect_error(kMinimal, {set}, {"--set " + set, message});
  // The model's sizes are bounded by ModelConfig::validate, once for every command.
  expect_error(kMinimal, {"model.n_embd=4294967296"}, {"model.n_embd = 4294967296", "allowed values are 1 to"});
  // The largest allowed timeout is a valid run.
  EXPECT_DOUBLE_EQ(parse_run_config(kMinimal, "run.toml", {"parallel.timeout_s=604800"}).parallel.timeout_s, 604800);
}

// A global batch whose grad_accum would pass grad_accum's own bound says so.
TEST(RunConfigErrors, GlobalBatchNeedingTooManyMicroBatchesNamesTheLimit) {
  expect_error(kMinimal, {"train.micro_batch=1", "train.global_batch=2000000"},
               {"train.global_batch = 2000000 needs train.grad_accum = 2000000, more than its maximum 1048576"});
}

// The ranks of a job compare their resolved run configs: a difference names
// each differing rank, every differing key and both values; [log] (per-rank
// outputs) is not compared.
TEST(RunConfigAgreement, DifferencesNameEveryRankKeyAndBothValues) {
  const nlohmann::ordered_json base = agreed_run_config(parse_run_config(kMinimal, "run.toml"));
  EXPECT_EQ(run_config_differences({base, base, base}), "");
  EXPECT_EQ(run_config_differences({base,
                                    agreed_run_config(parse_run_config(kMinimal, "run.toml", {"log.metrics=r1.jsonl"}))}),
            "");
  const nlohmann::ordered_json lr = agreed_run_config(parse_run_config(kMinimal, "run.toml", {"train.lr=0.2"}));
  const nlohmann::ordered_json shape = agreed_run_config(
      parse_run_config(kMinimal, "run.toml", {"model.n_embd=128", "data.train=other.bin"}));
  const std::string message = run_config_differences({base, base, lr, shape});
  EXPECT_EQ(message.find("rank 1"), std::string::npos) << message;
  for (const std::string part :
       {"rank 2's run config differs from rank 0's: train.lr = 0.2 on rank 2, 0.0006 on rank 0",
        "; rank 3's run config differs from rank 0's: ", "model.n_embd = 128 on rank 3, 64 on rank 0",
        "data.train = [\"other.bin\"] on rank 3, [\"train_*.bin\"] on rank 0",
        ": every rank must run the same config"})
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
}

TEST(RunConfig, ParameterServerKeysParse) {
  const RunConfig c = parse_run_config(kMinimal, "run.toml",
                                       {"parallel.mode=ps", "parallel.ps_servers=3", "parallel.ps_server=optimizer",
                                        "parallel.staleness=2", "parallel.dp=4"});
  EXPECT_EQ(c.parallel.mode, "ps");
  EXPECT_EQ(c.parallel.ps_servers, 3);
  EXPECT_EQ(c.parallel.ps_server, "optimizer");
  EXPECT_EQ(c.parallel.staleness, 2);
  const RunConfig d = parse_run_config(kMinimal, "run.toml", {});
  EXPECT_EQ(d.parallel.mode, "collective");
  EXPECT_EQ(d.parallel.ps_server, "sum");
  EXPECT_EQ(d.parallel.staleness, 0);
}

TEST(RunConfigErrors, ParameterServerLayoutsItCannotTrainAreRefusedWithTheReason) {
  expect_error(kMinimal, {"parallel.mode=ps", "parallel.tp=2"}, {"parallel.mode = ps", "tp = 2", "must be 1"});
  expect_error(kMinimal, {"parallel.mode=ps", "parallel.zero_stage=1"},
               {"parallel.zero_stage = 1", "servers hold the sharded state", "allowed 0"});
  expect_error(kMinimal, {"parallel.mode=ps", "parallel.ps_server=optimizer", "train.dtype=bf16"},
               {"ps_server = optimizer", "fp32", "train.dtype = bf16"});
  expect_error(kMinimal, {"parallel.staleness=1"}, {"parallel.staleness = 1", "needs parallel.mode = ps"});
  expect_error(kMinimal, {"parallel.mode=ps", "parallel.staleness=1"},
               {"parallel.staleness = 1", "ps_server = sum", "use ps_server = optimizer"});
  expect_error(kMinimal, {"parallel.mode=parameter_server"}, {"parallel.mode", "collective", "ps"});
  expect_error(kMinimal, {"parallel.mode=ps", "parallel.ps_server=adam"}, {"parallel.ps_server", "sum", "optimizer"});
}

}  // namespace
}  // namespace loom::train
