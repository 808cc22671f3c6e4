// RecentMap: a map that keeps the `capacity` keys put last, forgetting the oldest beyond it;
// for what a coordinator remembers of the sessions it served, which have no end.
// Not thread-safe: its owner locks.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <string>
#include <utility>

namespace recall::coordinator {

template <typename V>
class RecentMap {
 public:
  explicit RecentMap(size_t capacity) : capacity_(capacity) {}

  // Sets key's value and makes it the most recent; forgets the oldest key past capacity.
  void Put(const std::string& key, V value) {
    auto [it, added] = map_.try_emplace(key);
    if (!added) order_.erase(it->second.order);
    order_.push_front(key);
    it->second = {std::move(value), order_.begin()};
    if (map_.size() > capacity_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
  }
  // The value of key, or null.
  const V* Find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second.value;
  }
  void Erase(const std::string& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    order_.erase(it->second.order);
    map_.erase(it);
  }
  size_t size() const { return map_.size(); }

 private:
  struct Entry {
    V value;
    std::list<std::string>::iterator order;
  };
  const size_t capacity_;
  std::map<std::string, Entry> map_;
  std::list<std::string> order_;  // the most recent first
};

}  // namespace recall::coordinator
