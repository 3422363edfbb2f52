// A GGUF file's chat template (tokenizer.chat_template) is the one loom
// serves it with, with the texts of its BOS / EOS tokens as bos_token,
// eos_token and the stop string; a file without one gets the plain template.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/gguf.h"
#include "serve/store/chat_template.h"

namespace loom::serve {
namespace {

std::string write_gguf(const std::string& name, bool with_template) {
  io::GgufWriter w;
  w.add("general.architecture", io::GgufValue::string("llama"));
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a"};
  w.add("tokenizer.ggml.tokens", io::GgufValue::string_array(tokens));
  w.add("tokenizer.ggml.bos_token_id", io::GgufValue::u32(1));
  w.add("tokenizer.ggml.eos_token_id", io::GgufValue::u32(2));
  if (with_template)
    w.add("tokenizer.chat_template",
          io::GgufValue::string("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}"
                                "{% endfor %}"));
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  w.write(path);
  return path;
}

TEST(ChatTemplateGguf, TheFilesTemplateAndSpecialTokensAreUsed) {
  const std::string path = write_gguf("loom_test_chat_template.gguf", true);
  const ChatTemplate t = ChatTemplate::for_model_dir(path);
  EXPECT_FALSE(t.is_plain);
  EXPECT_EQ(t.bos_token, "<s>");
  EXPECT_EQ(t.eos_token, "</s>");
  EXPECT_EQ(t.stop, std::vector<std::string>{"</s>"});
  const auto render = chat_renderer(t);
  const nlohmann::json messages = nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(render(messages, nullptr, true, nullptr), "<s>[user] hi</s>");
}

TEST(ChatTemplateGguf, AFileWithoutATemplateGetsThePlainOne) {
  EXPECT_TRUE(ChatTemplate::for_model_dir(write_gguf("loom_test_chat_plain.gguf", false)).is_plain);
}

}  // namespace
}  // namespace loom::serve
