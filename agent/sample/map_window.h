// Reading a cumulative BPF hash map in windows: each read returns what every
// key gained since the previous read, so consecutive windows add up to one
// long read, with no sample lost between two windows or counted in both.
//
// Why deltas and not "read and delete": the BPF program increments a value
// through the pointer its lookup returned. A user-space delete between that
// lookup and the increment loses the sample (and the freed element may be
// reused for another key), so deleting hot keys every window would lose
// samples now and then. Keys only go once they have gained nothing for a whole
// window (Evict): then BPF_MAP_LOOKUP_AND_DELETE_ELEM returns what they gained
// since the read, which still counts, and the race above needs a sample of
// an idle key in the nanoseconds between a lookup and its increment.
//
// The per-window sample maps (by instruction, by stack) are not read this way:
// most of their keys live for one window, and evicting each with its own
// system call was most of a window's map reading. They come in two sets, and
// the set a window closed is drained whole (Sampler::ReadWindow, with
// ForEach's `drain`). This is for samples_by_pid, whose keys (processes)
// live across windows.
//
// Memory: the baseline holds one value per key in the map, so it is bounded by
// the map's max_entries.
// Not thread-safe: one thread owns a MapWindow.
#pragma once

#include <bpf/bpf.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bpf/sampler.h"

namespace tlsprof::sample {

// Value arithmetic for the map value types.
inline uint64_t Minus(uint64_t a, uint64_t b) { return a >= b ? a - b : a; }
inline pid_counts Minus(const pid_counts& a, const pid_counts& b) {
  return {Minus(a.user, b.user), Minus(a.kernel, b.kernel)};
}
inline bool IsZero(uint64_t v) { return v == 0; }
inline bool IsZero(const pid_counts& v) { return v.user == 0 && v.kernel == 0; }
inline void AddTo(uint64_t& a, uint64_t b) { a += b; }
inline void AddTo(pid_counts& a, const pid_counts& b) {
  a.user += b.user;
  a.kernel += b.kernel;
}

// Keys are plain C structs compared and hashed by their bytes (stack keys
// zero their unused frames and padding, so equal stacks have equal bytes).
template <typename Key>
struct KeyBytesHash {
  size_t operator()(const Key& k) const {
    return std::hash<std::string_view>()(std::string_view(reinterpret_cast<const char*>(&k), sizeof(Key)));
  }
};
template <typename Key>
struct KeyBytesEqual {
  bool operator()(const Key& a, const Key& b) const { return std::memcmp(&a, &b, sizeof(Key)) == 0; }
};

template <typename Key, typename Value>
class MapWindow {
 public:
  // Calls fn(key, value) for every entry of the map: one batch syscall per
  // `chunk` keys where the kernel supports batch operations on hash maps
  // (5.6+), else one get_next_key + lookup pair per key. Entries added during
  // the walk may or may not be seen; a later read sees them. `chunk` is a
  // first guess of the entries (the buffers are not zero-filled, and grow
  // when one bucket holds more); the keys read are zeroed after use (a stack
  // key's last frame can be a word of a user stack, docs/attribution.md).
  // With `drain`, every entry read is also deleted (lookup-and-delete): only
  // for a map no BPF program writes to any more (see Sampler::ReadWindow).
  template <typename Fn>
  static void ForEach(int fd, uint32_t chunk, Fn&& fn, bool drain = false) {
    chunk = std::clamp<uint32_t>(chunk, 16, 4096);
    // Default-initialised: filled by the kernel, only the filled part is read.
    std::unique_ptr<Key[]> keys(new Key[chunk]);
    std::unique_ptr<Value[]> values(new Value[chunk]);
    // The batch token of a hash map is a bucket index (4 bytes); give it room
    // of a key all the same, as libbpf's documentation asks.
    alignas(8) unsigned char token_in[std::max<size_t>(sizeof(Key), 8)] = {};
    alignas(8) unsigned char token_out[std::max<size_t>(sizeof(Key), 8)] = {};
    bool first = true, any = false;
    for (;;) {
      uint32_t count = chunk;
      LIBBPF_OPTS(bpf_map_batch_opts, opts);
      void* in = first ? nullptr : token_in;
      int err = drain ? bpf_map_lookup_and_delete_batch(fd, in, token_out, keys.get(), values.get(), &count, &opts)
                      : bpf_map_lookup_batch(fd, in, token_out, keys.get(), values.get(), &count, &opts);
      if (err != 0) err = errno;
      count = std::min(count, chunk);
      for (uint32_t i = 0; i < count; ++i) fn(keys[i], values[i]);
      explicit_bzero(keys.get(), count * sizeof(Key));
      any = any || count > 0;
      if (err == 0) {
        std::memcpy(token_in, token_out, sizeof(token_in));
        first = false;
        continue;
      }
      if (err == ENOENT) return;  // the last bucket was read
      if (err == ENOSPC && count == 0 && chunk < (1u << 20)) {
        chunk *= 2;  // one bucket holds more keys than the chunk
        keys.reset(new Key[chunk]);
        values.reset(new Value[chunk]);
        continue;
      }
      if (!first || any) return;    // a later batch failed: what was read stands
      ForEachByKey(fd, fn, drain);  // batch ops not supported
      return;
    }
  }

  MapWindow() = default;
  MapWindow(const MapWindow&) = delete;
  MapWindow& operator=(const MapWindow&) = delete;
  MapWindow(MapWindow&&) = default;
  MapWindow& operator=(MapWindow&& other) {
    Reset();
    baseline_ = std::move(other.baseline_);
    epoch_ = other.epoch_;
    return *this;
  }
  ~MapWindow() { Reset(); }

  // What each key gained since the previous Read (a new key: its whole
  // value). Keys that gained nothing are left out. Keys that gained nothing
  // in the previous window either are deleted from the map (see the header);
  // what they gained until the deletion is part of this window.
  std::vector<std::pair<Key, Value>> Read(int fd, std::vector<Key>* evicted = nullptr) {
    std::vector<std::pair<Key, Value>> gained;
    // The baseline is updated in place (a busy map's keys are mostly the
    // same from one window to the next); a key this read did not return (a
    // batch read that failed midway) leaves it. The first batch is sized for
    // the keys of the previous read and a quarter more.
    ++epoch_;
    const size_t hint = baseline_.size() + baseline_.size() / 4 + 16;
    ForEach(fd, static_cast<uint32_t>(std::min<size_t>(hint, 4096)), [&](const Key& key, const Value& value) {
      auto [it, inserted] = baseline_.try_emplace(key, Entry{value, 0, epoch_});
      Entry& e = it->second;
      const Value delta = inserted ? value : Minus(value, e.value);
      if (IsZero(delta)) {
        if (!inserted) ++e.idle_windows;
      } else {
        e.idle_windows = 0;
        gained.emplace_back(key, delta);
      }
      e.value = value;
      e.epoch = epoch_;
    });
    // Keys idle for a whole window go: taken out of the map with what they
    // gained since the read above.
    for (auto it = baseline_.begin(); it != baseline_.end();) {
      Entry& e = it->second;
      if (e.epoch != epoch_) {
        it = Erase(it);  // no longer in the map
        continue;
      }
      if (e.idle_windows < 1) {
        ++it;
        continue;
      }
      Value last{};
      if (bpf_map_lookup_and_delete_elem(fd, &it->first, &last) != 0) {
        ++it;  // kept: tried again next window
        continue;
      }
      const Value extra = Minus(last, e.value);
      if (!IsZero(extra)) gained.emplace_back(it->first, extra);
      if (evicted != nullptr) evicted->push_back(it->first);
      it = Erase(it);
    }
    return gained;
  }

  // Forget the baseline (the map was emptied).
  void Reset() {
    for (auto it = baseline_.begin(); it != baseline_.end();) it = Erase(it);
  }
  size_t size() const { return baseline_.size(); }

 private:
  struct Entry {
    Value value;
    uint32_t idle_windows;  // consecutive reads in which the key gained nothing
    uint64_t epoch;         // the last Read that saw the key in the map
  };
  using Baseline = std::unordered_map<Key, Entry, KeyBytesHash<Key>, KeyBytesEqual<Key>>;

  // Erases an entry with its key's bytes zeroed first (see ForEach).
  typename Baseline::iterator Erase(typename Baseline::iterator it) {
    explicit_bzero(const_cast<Key*>(&it->first), sizeof(Key));
    return baseline_.erase(it);
  }

  template <typename Fn>
  static void ForEachByKey(int fd, Fn&& fn, bool drain) {
    std::vector<Key> keys;
    Key key{};
    Key next{};
    const Key* prev = nullptr;
    while (bpf_map_get_next_key(fd, prev, &next) == 0) {
      keys.push_back(next);
      key = next;
      prev = &key;
    }
    // Looked up (and deleted) after the walk: deleting while walking could
    // restart or skip it.
    for (Key& k : keys) {
      Value value{};
      if (bpf_map_lookup_elem(fd, &k, &value) == 0) {
        if (drain) bpf_map_delete_elem(fd, &k);
        fn(k, value);
      }
    }
    explicit_bzero(keys.data(), keys.size() * sizeof(Key));
    explicit_bzero(&key, sizeof(key));
    explicit_bzero(&next, sizeof(next));
  }

  Baseline baseline_;
  uint64_t epoch_ = 0;
};

}  // namespace tlsprof::sample
