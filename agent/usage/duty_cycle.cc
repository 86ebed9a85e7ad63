#include "agent/usage/duty_cycle.h"

#include <algorithm>

namespace tlsprof::usage {

DutyCycle::DutyCycle(const Options& options, double now)
    : options_(options),
      start_(now),
      tokens_(options.budget * options.capacity_seconds),
      last_now_(now),
      on_since_(now) {}

DutyCycle::Action DutyCycle::Tick(double now, double cost) {
  const double dt = std::max(0.0, now - last_now_);
  last_now_ = now;
  const double spent = last_cost_ < 0 ? 0.0 : std::max(0.0, cost - last_cost_);
  last_cost_ = cost;
  cost_ += spent;
  if (options_.budget <= 0) return Action::kNone;
  // The bucket holds capacity_seconds of budget, or one shortest on-phase
  // at the rate last seen, whichever is more (else the probes, once off,
  // could never afford to come back).
  const double phase = std::max(0.0, (rate_ - options_.budget) * options_.min_on_seconds);
  tokens_ = std::min(tokens_ + options_.budget * dt - spent,
                     std::max(options_.budget * options_.capacity_seconds, phase));
  if (on_) {
    // The rate while on, smoothed over about a second of ticks.
    if (dt > 0) {
      const double r = spent / dt;
      const double a = std::min(1.0, dt);
      rate_ = rate_ == 0 ? r : (1 - a) * rate_ + a * r;
    }
    return tokens_ < 0 ? Action::kDetach : Action::kNone;
  }
  // Off: back on once an on-phase of min_on_seconds fits, paid at the rate
  // last seen above the budget's own accrual.
  return tokens_ >= phase ? Action::kAttach : Action::kNone;
}

void DutyCycle::Toggled(double now, bool on, double toggle_cost) {
  if (on == on_) return;
  toggle_cost_ += toggle_cost;
  tokens_ -= toggle_cost;
  ++toggles_;
  if (on) {
    on_since_ = now;
  } else {
    on_total_ += std::max(0.0, now - on_since_);
  }
  on_ = on;
}

double DutyCycle::on_seconds(double now) const {
  return on_total_ + (on_ ? std::max(0.0, now - on_since_) : 0.0);
}

double DutyCycle::allowed_seconds(double now) const {
  return options_.budget <= 0 ? 0.0 : options_.budget * std::max(0.0, now - start_);
}

}  // namespace tlsprof::usage
