#include "agent/usage/duty_cycle.h"

#include <algorithm>
#include <chrono>

namespace tlsprof::usage {

DutyCycle::DutyCycle(const Options& options, double now)
    : options_(options),
      random_(options.seed ? options.seed
                           : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())),
      start_(now),
      last_now_(now),
      cycle_start_(now),
      cycle_end_(now + options.min_cycle_seconds),
      on_begin_(now),
      on_end_(now + options.min_cycle_seconds),
      wrap_end_(now),
      on_since_(now) {}

void DutyCycle::PlanCycle(double now) {
  // What the last on-phase cost per second on.
  const double on_in_cycle = on_seconds(now) - cycle_on_seconds_at_start_;
  if (on_in_cycle > 0.05) {
    const double r = cycle_on_cost_ / on_in_cycle;
    rate_ = rate_ == 0 ? r : 0.5 * rate_ + 0.5 * r;
  }
  cycle_on_cost_ = 0;
  cycle_on_seconds_at_start_ = on_seconds(now);
  // The share that spends the budget, plus the balance paid back over
  // repay_seconds; all of it while the probes cost less than the budget.
  const double spend = options_.budget + std::clamp(balance_, -options_.budget * options_.repay_seconds,
                                                    options_.budget * options_.repay_seconds) /
                                             options_.repay_seconds;
  // At least one shortest on-phase per longest cycle: a cycle with no
  // on-phase would leave its events with no estimate at all.
  const double floor = options_.min_on_seconds / options_.max_cycle_seconds;
  share_ = rate_ <= 0 ? 1.0 : std::clamp(spend / rate_, floor, 1.0);
  const double length = share_ >= 1.0 ? options_.min_cycle_seconds
                                      : std::clamp(options_.min_on_seconds / share_, options_.min_cycle_seconds,
                                                   options_.max_cycle_seconds);
  const double on_length = std::max(share_ * length, std::min(options_.min_on_seconds, length));
  share_ = std::min(1.0, on_length / length);  // the weights must be the share actually on
  cycle_start_ = now;
  cycle_end_ = now + length;
  // The on-phase starts anywhere in the cycle and wraps around its end to
  // its start, so every moment of the cycle is on with the same chance
  // (a phase kept inside would cover the cycle's middle more often).
  std::uniform_real_distribution<double> offset(0.0, length);
  const double u = share_ >= 1.0 ? 0.0 : offset(random_);
  on_begin_ = now + u;
  on_end_ = std::min(now + u + on_length, cycle_end_);
  wrap_end_ = now + std::max(0.0, u + on_length - length);
}

DutyCycle::Action DutyCycle::Tick(double now, double cost) {
  const double dt = std::max(0.0, now - last_now_);
  last_now_ = now;
  const double spent = last_cost_ < 0 ? 0.0 : std::max(0.0, cost - last_cost_);
  last_cost_ = cost;
  cost_ += spent;
  if (on_) cycle_on_cost_ += spent;
  if (options_.budget <= 0) return Action::kNone;
  balance_ += options_.budget * dt - spent;
  if (now >= cycle_end_) PlanCycle(now);
  const bool want = share_ >= 1.0 || (now >= on_begin_ && now < on_end_) || now < wrap_end_;
  if (want == on_) return Action::kNone;
  return want ? Action::kAttach : Action::kDetach;
}

void DutyCycle::Toggled(double now, bool on, double toggle_cost) {
  if (on == on_) return;
  toggle_cost_ += toggle_cost;
  balance_ -= toggle_cost;
  ++toggles_;
  if (on) {
    on_since_ = now;
  } else {
    on_total_ += std::max(0.0, now - on_since_);
  }
  on_ = on;
}

double DutyCycle::on_seconds(double now) const { return on_total_ + (on_ ? std::max(0.0, now - on_since_) : 0.0); }

double DutyCycle::allowed_seconds(double now) const {
  return options_.budget <= 0 ? 0.0 : options_.budget * std::max(0.0, now - start_);
}

}  // namespace tlsprof::usage
