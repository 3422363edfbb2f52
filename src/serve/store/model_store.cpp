#include "serve/store/model_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/sha256.h"

namespace loom::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; }

// what: "the tag" or "each part of the name" (the parts between slashes).
void check_part(std::string_view part, std::string_view whole, const char* what) {
  LOOM_REQUIRE(!part.empty() && part.size() <= 128, "model name '", whole, "': ", what,
               " must be 1 to 128 characters");
  LOOM_REQUIRE(std::isalnum(static_cast<unsigned char>(part[0])), "model name '", whole, "': ", what,
               " must start with a letter or digit");
  LOOM_REQUIRE(std::all_of(part.begin(), part.end(), name_char), "model name '", whole, "': ", what,
               " may hold only letters, digits, '.', '_' and '-'");
  LOOM_REQUIRE(part.size() < 4 || part.substr(part.size() - 4) != ".tmp", "model name '", whole, "': ", what,
               " may not end in .tmp (the store's temporary files do)");
}

// The store's lock: writers (create, copy, remove) hold it, so collecting
// unnamed blobs never races a model being added.
class StoreLock {
 public:
  explicit StoreLock(const std::string& root) {
    const std::string path = root + "/.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw StoreError(concat("cannot open the model store's lock ", path, ": ", std::strerror(errno),
                              " (create, cp and rm write to the store: it must be writable; choose another with "
                              "--models DIR)"));
    if (::flock(fd_, LOCK_EX) != 0) {
      const int err = errno;
      ::close(fd_);
      throw StoreError(concat("cannot lock the model store ", root, ": ", std::strerror(err)));
    }
  }
  ~StoreLock() { ::close(fd_); }
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;

 private:
  int fd_ = -1;
};

// write_file_atomic's failure (the store's disk: read-only, full) as the store's own error.
void write_store_file(const std::string& path, std::string_view bytes) {
  try {
    write_file_atomic(path, bytes);
  } catch (const loom::Error& e) {
    throw StoreError(concat("cannot write to the model store: ", e.what()));
  }
}

std::string hex_of(const std::string& digest) {
  LOOM_REQUIRE(digest.rfind("sha256:", 0) == 0 && digest.size() == 7 + 64 &&
                   std::all_of(digest.begin() + 7, digest.end(), [](char c) { return std::isxdigit(c) != 0; }),
               "'", digest, "' is not a sha256 digest (sha256:<64 hex digits>)");
  return digest.substr(7);
}

// Every regular file under dir, depth first. Reading takes no lock: a concurrent loom rm may remove a file
// or a namespace's folder mid-walk, so each step takes an error_code and what went is skipped, not thrown.
void files_under(const fs::path& dir, std::vector<fs::path>& out) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code gone;
    if (it->is_directory(gone)) files_under(it->path(), out);
    else if (it->is_regular_file(gone)) out.push_back(it->path());
  }
}

int64_t mtime_seconds(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
}

}  // namespace

namespace {

// text with control characters (a NUL would cut the message short) as \xNN.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) {
      out += c;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
    out += hex;
  }
  return out;
}

}  // namespace

ModelName ModelName::parse(std::string_view text) {
  LOOM_REQUIRE(!text.empty(), "a model name is empty: give name or name:tag (e.g. quickstart, my/model:v2)");
  LOOM_REQUIRE(std::none_of(text.begin(), text.end(),
                            [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }),
               "model name '", printable(text), "' holds a control character: names hold letters, digits, '.', '_', "
               "'-', '/' between parts and ':' before the tag");
  LOOM_REQUIRE(text.front() != '/' && text.front() != '.' && text.find("//") == std::string_view::npos,
               "model name '", text, "' looks like a path: a model name is name or name:tag (e.g. quickstart, "
               "my/model:v2); to make a model from a directory or a .gguf file, write a Modelfile with FROM ",
               text, " and run loom create NAME -f Modelfile");
  ModelName n;
  const size_t colon = text.rfind(':');
  const std::string_view name = colon == std::string_view::npos ? text : text.substr(0, colon);
  n.tag = colon == std::string_view::npos ? "latest" : std::string(text.substr(colon + 1));
  check_part(n.tag, text, "the tag");
  size_t start = 0;
  while (true) {
    const size_t slash = name.find('/', start);
    check_part(name.substr(start, slash == std::string_view::npos ? slash : slash - start), text,
               "each part of the name");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  n.name = std::string(name);
  return n;
}

const Layer* Manifest::find(std::string_view media_type) const {
  for (const Layer& l : layers)
    if (l.media_type == media_type) return &l;
  return nullptr;
}

int64_t Manifest::total_size() const {
  int64_t total = 0;
  for (const Layer& l : layers) total += l.size;
  return total;
}

json Manifest::to_json() const {
  json ls = json::array();
  for (const Layer& l : layers) ls.push_back({{"mediaType", l.media_type}, {"digest", l.digest}, {"size", l.size}});
  return {{"schemaVersion", 2}, {"mediaType", "application/vnd.loom.manifest.v1+json"}, {"layers", ls}};
}

Manifest Manifest::from_json(const json& j, const std::string& where) {
  LOOM_REQUIRE(j.is_object() && j.contains("layers") && j["layers"].is_array(), where,
               " is not a model manifest (no \"layers\" list)");
  Manifest m;
  for (const json& l : j["layers"]) {
    LOOM_REQUIRE(l.is_object() && l.value("mediaType", json()).is_string() && l.value("digest", json()).is_string() &&
                     l.value("size", json()).is_number_integer(),
                 where, ": a layer needs mediaType, digest and size");
    m.layers.push_back({l["mediaType"], l["digest"], l["size"]});
    hex_of(m.layers.back().digest);
  }
  return m;
}

ModelStore::ModelStore(std::string root, bool create) : root_(std::move(root)) {
  std::error_code exists;
  LOOM_REQUIRE(!fs::exists(root_, exists) || fs::is_directory(root_, exists), "the model store '", root_,
               "' is a file: a store is a directory (--models DIR)");
  if (!create) return;
  std::error_code ec;
  fs::create_directories(fs::path(root_) / "blobs", ec);
  if (!ec) fs::create_directories(fs::path(root_) / "manifests", ec);
  if (ec)
    throw StoreError(concat("cannot create the model store at ", root_, ": ", ec.message(),
                            " (choose another with --models DIR)"));
}

std::string ModelStore::blob_path(const std::string& digest) const {
  return (fs::path(root_) / "blobs" / ("sha256-" + hex_of(digest))).string();
}

std::string ModelStore::read_blob(const std::string& digest) const {
  std::ifstream in(blob_path(digest), std::ios::binary);
  LOOM_REQUIRE(in.good(), "the model store lacks blob ", digest, " (", blob_path(digest), ")");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string ModelStore::manifest_path(const ModelName& name) const {
  return (fs::path(root_) / "manifests" / name.name / name.tag).string();
}

Layer ModelStore::put_layer(const LayerSource& src) {
  if (!src.digest.empty()) {
    const std::string path = blob_path(src.digest);
    LOOM_REQUIRE(fs::exists(path), "the model store lacks blob ", src.digest);
    return {src.media_type, src.digest, static_cast<int64_t>(fs::file_size(path))};
  }
  const bool from_file = !src.file.empty();
  const std::string digest = "sha256:" + (from_file ? sha256_file_hex(src.file) : sha256_hex(src.bytes));
  const std::string path = blob_path(digest);
  if (!fs::exists(path)) {
    if (from_file) {
      // Copied to a temporary name first, so a blob is never seen half-written.
      const std::string tmp = path + ".tmp";
      std::error_code ec;
      fs::copy_file(src.file, tmp, fs::copy_options::overwrite_existing, ec);
      if (ec) throw StoreError(concat("cannot copy ", src.file, " into the model store: ", ec.message()));
      fs::rename(tmp, path, ec);
      if (ec) throw StoreError(concat("cannot add blob ", path, " to the model store: ", ec.message()));
    } else {
      write_store_file(path, src.bytes);
    }
  }
  return {src.media_type, digest, static_cast<int64_t>(fs::file_size(path))};
}

void ModelStore::write_manifest(const ModelName& name, const Manifest& m) {
  const fs::path path = manifest_path(name);
  // A name of many parts makes a path longer than the file system takes (ENAMETOOLONG): the name is at
  // fault, not a clash; checked with the temporary file's ".tmp" that write_file_atomic adds.
  const long limit = ::pathconf(root_.c_str(), _PC_PATH_MAX);
  const size_t max_path = limit > 0 ? static_cast<size_t>(limit) : PATH_MAX;
  const std::string shown = name.str().size() > 60 ? name.str().substr(0, 60) + "..." : name.str();
  const auto too_long = [&] {
    return loom::Error(concat("model name '", shown, "' (", name.str().size(), " characters) is too long for the ",
                              "file system: its manifest ", root_, "/manifests/<name>/<tag> would be a path of ",
                              path.string().size() + 4, " bytes, and the limit here is ", max_path - 1,
                              " (ENAMETOOLONG): use fewer or shorter parts"));
  };
  if (path.string().size() + 4 >= max_path) throw too_long();
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec == std::errc::filename_too_long) throw too_long();
  LOOM_REQUIRE(ec != std::errc::not_a_directory && ec != std::errc::file_exists && !fs::is_directory(path),
               "model name '", name.str(), "' clashes with another model's name (", name.name,
               " is both a model and a folder of models)");
  if (ec) throw StoreError(concat("cannot write the manifest of ", name.str(), " to the model store: ", ec.message()));
  write_store_file(path.string(), m.to_json().dump(2) + "\n");
}

// Files a writer killed mid-write left behind (*.tmp under blobs/ and
// manifests/, up to a model's size): with the lock held no writer runs, so
// every one is a leftover.
void ModelStore::collect_leftovers() {
  std::error_code ec;
  for (const char* dir : {"blobs", "manifests"}) {
    const fs::path base = fs::path(root_) / dir;
    if (!fs::is_directory(base, ec)) continue;
    std::vector<fs::path> gone;
    for (const auto& entry : fs::recursive_directory_iterator(base, ec))
      if (entry.is_regular_file(ec) && entry.path().extension() == ".tmp") gone.push_back(entry.path());
    for (const fs::path& p : gone) fs::remove(p, ec);
  }
}

// The manifest name has now, before a write replaces it (none when it has none, or one that cannot be read:
// then its blobs stay, as collect_garbage keeps every blob when a manifest cannot be read).
std::optional<Manifest> ModelStore::replaced_manifest(const ModelName& name) const {
  try {
    if (std::optional<StoredModel> old = get(name)) return std::move(old->manifest);
  } catch (const loom::Error&) {
  }
  return std::nullopt;
}

StoredModel ModelStore::put_model(const ModelName& asked, const std::vector<LayerSource>& layers) {
  const StoreLock lock(root_);
  const ModelName name = existing_name(asked);  // ollama: re-creating Foo over foo replaces foo
  collect_leftovers();
  const std::optional<Manifest> old = replaced_manifest(name);
  Manifest m;
  for (const LayerSource& src : layers) m.layers.push_back(put_layer(src));
  write_manifest(name, m);
  // A re-created model's old blobs (its former weights, say) go when no manifest names them any more.
  if (old) collect_garbage(&*old);
  return *get(name);
}

ModelName ModelStore::existing_name(const ModelName& name) const {
  std::error_code ec;
  const fs::path base = fs::path(root_) / "manifests";
  if (fs::is_regular_file(manifest_path(name), ec) || !fs::is_directory(base, ec)) return name;
  const auto lower = [](std::string t) {
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return t;
  };
  const std::string want = lower(name.str());
  std::vector<fs::path> files;
  files_under(base, files);
  std::sort(files.begin(), files.end());  // the first in name order, when two spellings are stored
  for (const fs::path& file : files) {
    const fs::path rel = file.lexically_relative(base);
    const std::string text = rel.parent_path().generic_string() + ":" + rel.filename().string();
    if (file.extension() == ".tmp" || lower(text) != want) continue;
    try {
      return ModelName::parse(text);
    } catch (const loom::Error&) {
    }
  }
  return name;
}

std::optional<StoredModel> ModelStore::get(const ModelName& asked) const {
  const ModelName name = existing_name(asked);
  const std::string path = manifest_path(name);
  std::error_code ec;  // a name too long for the file system (ENAMETOOLONG) names no model
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in.good(), "cannot read the manifest ", path);
  std::ostringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, false);
  LOOM_REQUIRE(!j.is_discarded(), "the manifest ", path, " is not JSON");
  return StoredModel{name, Manifest::from_json(j, path), "sha256:" + sha256_hex(text.str()), mtime_seconds(path)};
}

std::vector<StoredModel> ModelStore::list() const {
  std::vector<StoredModel> out;
  const fs::path base = fs::path(root_) / "manifests";
  std::error_code ec;
  if (!fs::is_directory(base, ec)) return out;  // a store never written to
  std::vector<fs::path> files;
  files_under(base, files);
  for (const fs::path& file : files) {
    if (file.extension() == ".tmp") continue;
    const fs::path rel = file.lexically_relative(base);
    try {
      const ModelName n = ModelName::parse(rel.parent_path().generic_string() + ":" + rel.filename().string());
      if (auto m = get(n)) out.push_back(std::move(*m));
    } catch (const loom::Error&) {
      // A stray file under manifests/ is not a model.
    }
  }
  std::sort(out.begin(), out.end(), [](const StoredModel& a, const StoredModel& b) {
    return a.name.str() < b.name.str();
  });
  return out;
}

bool ModelStore::copy(const ModelName& from, const ModelName& to) {
  const StoreLock lock(root_);
  collect_leftovers();
  const std::optional<StoredModel> m = get(from);
  if (!m) return false;
  const ModelName target = existing_name(to);
  const std::optional<Manifest> old = replaced_manifest(target);
  write_manifest(target, m->manifest);
  if (old) collect_garbage(&*old);  // the replaced model's blobs that nothing else names
  return true;
}

bool ModelStore::remove(const ModelName& name) {
  const StoreLock lock(root_);
  collect_leftovers();
  const fs::path path = manifest_path(existing_name(name));
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;  // a folder of models a/b/ is not the model a:b
  fs::remove(path, ec);
  if (ec) throw StoreError(concat("cannot remove ", path.string(), " from the model store: ", ec.message()));
  // Empty name directories go too (manifests/<a>/<b>/ of a removed a/b:tag).
  for (fs::path dir = path.parent_path(); dir != fs::path(root_) / "manifests" && fs::is_empty(dir, ec);
       dir = dir.parent_path())
    fs::remove(dir, ec);
  collect_garbage();
  return true;
}

// Every file under manifests/ must be read for its blobs to be known: if
// one cannot be (unreadable, not JSON, not a manifest), nothing is removed,
// rather than the blobs of a model that could not be read. only: just its
// layers' blobs are candidates (a replaced manifest's); null: every blob.
void ModelStore::collect_garbage(const Manifest* only) {
  std::set<std::string> named;
  const fs::path base = fs::path(root_) / "manifests";
  for (const auto& entry : fs::recursive_directory_iterator(base)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const json j = json::parse(text.str(), nullptr, false);
    if (!in.good() && !in.eof()) return;
    if (entry.path().extension() == ".tmp") continue;  // a manifest being written names blobs already present
    try {
      for (const Layer& l : Manifest::from_json(j, entry.path().string()).layers)
        named.insert("sha256-" + hex_of(l.digest));
    } catch (const loom::Error&) {
      return;
    }
  }
  if (only != nullptr) {
    std::error_code ec;
    for (const Layer& l : only->layers)
      if (named.count("sha256-" + hex_of(l.digest)) == 0) fs::remove(blob_path(l.digest), ec);
    return;
  }
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / "blobs"))
    if (named.count(entry.path().filename().string()) == 0) fs::remove(entry.path());
}

std::string default_store_root(const char* home) {
  LOOM_REQUIRE(home != nullptr && *home != '\0', "HOME is not set: give the model store with --models DIR");
  return (fs::path(home) / ".loom" / "models").string();
}

}  // namespace loom::serve
