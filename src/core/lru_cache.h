// A map of at most `capacity` entries that drops the least recently used
// one to make room: for caches keyed by shapes that a workload may vary
// without bound (cuBLASLt's GEMM plans under MoE's per-expert row counts).
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <utility>

#include "core/error.h"

namespace loom {

template <typename Key, typename Value>
class LruCache {
 public:
  // evict runs on each value dropped for room (not on the cache's own
  // destruction: a process-lifetime cache may outlive what evict needs).
  explicit LruCache(size_t capacity, std::function<void(Value&)> evict = {})
      : capacity_(capacity), evict_(std::move(evict)) {
    LOOM_CHECK(capacity > 0, "LruCache: capacity must be at least 1");
  }

  // The value for key, now the most recently used; made by make() when
  // absent (a throw leaves the cache unchanged). The reference holds until
  // the next call.
  template <typename Make>
  Value& get_or_make(const Key& key, Make&& make) {
    if (auto it = index_.find(key); it != index_.end()) {
      entries_.splice(entries_.begin(), entries_, it->second);
      return it->second->second;
    }
    Value value = make();
    if (entries_.size() == capacity_) {
      auto& [old_key, old_value] = entries_.back();
      if (evict_) evict_(old_value);
      index_.erase(old_key);
      entries_.pop_back();
    }
    entries_.emplace_front(key, std::move(value));
    index_.emplace(key, entries_.begin());
    return entries_.front().second;
  }

  bool contains(const Key& key) const { return index_.count(key) != 0; }
  size_t size() const { return entries_.size(); }

 private:
  using Entries = std::list<std::pair<Key, Value>>;
  size_t capacity_;
  std::function<void(Value&)> evict_;
  Entries entries_;  // most recently used first
  std::map<Key, typename Entries::iterator> index_;
};

}  // namespace loom
