#include "train/config_agree.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"

namespace loom::train {
namespace {

using json = nlohmann::ordered_json;

// "section.key" -> value, in the JSON's order; nested objects join with '.'.
void flatten(const json& j, const std::string& prefix, std::vector<std::pair<std::string, const json*>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) flatten(*it, key, out);
    else out.emplace_back(key, &*it);
  }
}

// As the config's own errors write values: strings in single quotes.
std::string value_text(const json* v) {
  if (v == nullptr) return "(absent)";
  return v->is_string() ? "'" + v->get<std::string>() + "'" : v->dump();
}

// FNV-1a: a digest to compare, not a defence against forgery.
int64_t digest(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  int64_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

// Every rank's text, through two all_gathers (lengths, then the bytes packed
// into int64 words, the comm dtypes having no byte type).
std::vector<std::string> all_gather_texts(comm::Communicator& comm, const std::string& text) {
  const int n = comm.size();
  int64_t length = static_cast<int64_t>(text.size());
  std::vector<int64_t> lengths(n);
  comm.all_gather(Tensor(lengths.data(), DType::i64, {n}), Tensor(&length, DType::i64, {1}))->wait();
  const int64_t words = (*std::max_element(lengths.begin(), lengths.end()) + 7) / 8;
  std::vector<int64_t> mine(words, 0), all(static_cast<size_t>(words) * n);
  std::memcpy(mine.data(), text.data(), text.size());
  comm.all_gather(Tensor(all.data(), DType::i64, {words * n}), Tensor(mine.data(), DType::i64, {words}))->wait();
  std::vector<std::string> texts(n);
  for (int r = 0; r < n; ++r)
    texts[r].assign(reinterpret_cast<const char*>(&all[static_cast<size_t>(r * words)]),
                    static_cast<size_t>(lengths[r]));
  return texts;
}

}  // namespace

json agreed_run_config(const RunConfig& c) {
  json j = run_config_to_json(c);
  j.erase("log");
  return j;
}

std::string run_config_differences(const std::vector<json>& per_rank) {
  std::string out;
  if (per_rank.empty()) return out;
  std::vector<std::pair<std::string, const json*>> base;
  flatten(per_rank[0], "", base);
  for (size_t r = 1; r < per_rank.size(); ++r) {
    std::vector<std::pair<std::string, const json*>> mine;
    flatten(per_rank[r], "", mine);
    std::map<std::string, const json*> theirs(base.begin(), base.end()), ours(mine.begin(), mine.end());
    std::string keys;
    auto note = [&](const std::string& key, const json* here, const json* at0) {
      keys += concat(keys.empty() ? "" : ", ", key, " = ", value_text(here), " on rank ", r, ", ", value_text(at0),
                     " on rank 0");
    };
    for (const auto& [key, v] : mine) {
      const auto it = theirs.find(key);
      const json* at0 = it == theirs.end() ? nullptr : it->second;
      if (at0 == nullptr || *at0 != *v) note(key, v, at0);
    }
    for (const auto& [key, v] : base)
      if (!ours.contains(key)) note(key, nullptr, v);
    if (!keys.empty()) out += concat(out.empty() ? "" : "; ", "rank ", r, "'s run config differs from rank 0's: ", keys);
  }
  if (!out.empty())
    out += ": every rank must run the same config (give each the same --config file and --set overrides)";
  return out;
}

void require_same_run_config(comm::Communicator& comm, const json& run) {
  const std::string text = run.dump();
  const int n = comm.size();
  int64_t mine = digest(text);
  std::vector<int64_t> digests(n);
  comm.all_gather(Tensor(digests.data(), DType::i64, {n}), Tensor(&mine, DType::i64, {1}))->wait();
  if (std::all_of(digests.begin(), digests.end(), [&](int64_t d) { return d == digests[0]; })) return;
  std::vector<json> per_rank;
  for (const std::string& t : all_gather_texts(comm, text)) per_rank.push_back(json::parse(t));
  const std::string message = run_config_differences(per_rank);
  LOOM_CHECK(!message.empty(), "run configs with different digests compare equal");
  throw comm::CollectiveError(message);
}

}  // namespace loom::train
