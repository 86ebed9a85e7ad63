// The memory Submits in progress may hold (--max-request-memory): each
// reserves what it will hold before it reads its message, and gives it back
// when it answers.
//
// Thread-safe. A reservation that does not fit waits (a bounded time) for
// others to end, so that a burst of honest calls queues instead of being
// refused; a waiting call holds a gRPC thread but none of the memory.
// Waiters are served in arrival order, each woken alone when its bytes fit:
// a flood cannot starve a call that came before it, and a release does not
// wake every waiting thread (up to the server's thread limit of them, all
// contending for one mutex on every release).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace tlsprof::collector {

class MemoryBudget {
 public:
  explicit MemoryBudget(size_t limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Bytes held until destroyed (or moved from).
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept : budget_(other.budget_), bytes_(other.bytes_) {
      other.budget_ = nullptr;
    }
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation() {
      if (budget_) budget_->Release(bytes_);
    }
    // Gives back what is held above `bytes` (a message read, its size known).
    void ShrinkTo(size_t bytes) {
      if (bytes < bytes_) {
        budget_->Release(bytes_ - bytes);
        bytes_ = bytes;
      }
    }
    size_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* budget, size_t bytes) : budget_(budget), bytes_(bytes) {}
    MemoryBudget* budget_;
    size_t bytes_;
  };

  // `bytes` reserved, waiting up to `wait` for them to fit; nullopt if they
  // did not. With nothing reserved, any size fits: a limit below one message
  // must not refuse that message for good.
  std::optional<Reservation> Reserve(size_t bytes, std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    if (waiters_.empty() && FitsLocked(bytes)) {
      in_use_ += bytes;
      return Reservation(this, bytes);
    }
    Waiter self(bytes);
    waiters_.push_back(&self);
    if (!self.cv.wait_for(lock, wait, [&] { return self.granted; })) {
      waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &self));
      GrantLocked();  // those behind may fit now
      return std::nullopt;
    }
    return Reservation(this, bytes);
  }

  size_t in_use() const {
    std::lock_guard lock(mu_);
    return in_use_;
  }
  size_t limit() const { return limit_; }

 private:
  struct Waiter {
    explicit Waiter(size_t b) : bytes(b) {}
    size_t bytes;
    bool granted = false;
    std::condition_variable cv;
  };

  bool FitsLocked(size_t bytes) const { return in_use_ == 0 || in_use_ + bytes <= limit_; }
  // Grants the waiters at the head of the queue whose bytes fit, in order.
  void GrantLocked() {
    while (!waiters_.empty() && FitsLocked(waiters_.front()->bytes)) {
      Waiter* w = waiters_.front();
      waiters_.pop_front();
      in_use_ += w->bytes;
      w->granted = true;
      w->cv.notify_one();
    }
  }
  void Release(size_t bytes) {
    std::lock_guard lock(mu_);
    in_use_ -= bytes;
    GrantLocked();
  }

  const size_t limit_;
  mutable std::mutex mu_;
  size_t in_use_ = 0;
  std::deque<Waiter*> waiters_;  // in arrival order
};

}  // namespace tlsprof::collector
