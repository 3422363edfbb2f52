// A checkpoint of LoRA adapters (checkpoint_manifest.h): what it records of
// the adapters and their base, and the check that a resume continues them.
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/lora.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer.h"

namespace loom::train {

nlohmann::json lora_json(Trainer& t) {
  const RunConfig& c = t.config();
  const model::LoraConfig& l = c.lora.adapters;
  return {{"rank", l.rank},
          {"alpha", l.alpha},
          {"modules", model::lora_module_names(c.model, l)},
          {"base", c.lora.base},
          {"base_sha256", t.lora_base_sha256()}};
}

void check_same_lora(const nlohmann::json& m, Trainer& t, const std::string& where) {
  const RunConfig& c = t.config();
  const bool saved = m.contains("lora"), run = c.lora.adapters.enabled();
  LOOM_REQUIRE(saved == run, where, saved ? ": the checkpoint holds LoRA adapters, but this run trains every "
                                            "parameter: resume it with its [lora] section (lora.base = '" +
                                                m["lora"].value("base", std::string("?")) + "')"
                                          : ": the checkpoint holds a whole model, but this run trains LoRA adapters: "
                                            "start the adapters from the model it saved (lora.base) instead of "
                                            "resuming");
  if (!run) return;
  const nlohmann::json& s = m["lora"];
  const nlohmann::json now = lora_json(t);
  LOOM_REQUIRE(s.value("base_sha256", std::string()) == now["base_sha256"], where,
               ": the adapters were trained on a base whose weights have SHA-256 ", s.value("base_sha256", std::string()),
               " ('", s.value("base", std::string()), "'), but lora.base = '", c.lora.base, "' has ",
               now["base_sha256"].get<std::string>(), ": resume them on the same base model");
  for (const char* key : {"rank", "alpha", "modules"})
    LOOM_REQUIRE(s.value(key, nlohmann::json()) == now[key], where, ": the adapters were saved with lora ", key, " = ",
                 s.value(key, nlohmann::json()).dump(), ", this run has ", now[key].dump(),
                 ": resume with the same [lora] rank, alpha and targets");
}

}  // namespace loom::train
