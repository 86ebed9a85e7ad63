#include "agent/usage/duty_cycle.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

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

void DutyCycle::EndCycle(double now, double weighted) {
  const bool early = now < cycle_end_;
  // The error of the cycle that ends: its weighted count against the
  // cycle's before it (DutyCycle's comment).
  const double length = now - cycle_start_;
  if (length > 0) {
    const double e = std::max(0.0, weighted - cycle_weighted_start_);
    const double r = e / length;
    double v = 0;
    if (share_ < 1.0) {
      const double binomial = e * (1.0 / share_ - 1.0);
      v = binomial;
      if (have_prev_) {
        const double diff = length * (r - prev_rate_);
        const double d2 = diff * diff * (prev_sampled_ ? 0.5 : 1.0);
        v = std::max(v, d2);
        // The difference speaks for the cycle before too (a load that
        // stopped in it, its phase before the stop, showed no change
        // there): raised to it if it was sampled.
        if (prev_sampled_) variance_ += std::max(0.0, d2 - prev_variance_);
      }
      variance_ += v;
    }
    prev_variance_ = v;
    // A share-1 cycle cut short (a load that jumped, within milliseconds)
    // counted too few events for its rate to be a reference.
    have_prev_ = share_ < 1.0 || length >= options_.min_cycle_seconds / 4;
    prev_sampled_ = share_ < 1.0;
    prev_rate_ = r;
  }
  cycle_weighted_start_ = weighted;
  // What the probes cost per second attached in the cycle that ends. A
  // share-1 cycle cut short by a jump of the load measured the new load:
  // taken as it is, not averaged with the old one.
  const double on_in_cycle = on_seconds(now) - cycle_on_seconds_at_start_;
  if (on_in_cycle > 0.005) {
    const double r = cycle_cost_ / on_in_cycle;
    rate_ = rate_ == 0 || early ? r : 0.5 * rate_ + 0.5 * r;
  }
  // And per second counted, in a sampled cycle: the phase with all that
  // comes with it (the grace, an attach or detach that takes its time).
  const double counted_in_cycle = counted_seconds(now) - cycle_counted_at_start_;
  if (share_ < 1.0 && counted_in_cycle > 0.005) {
    const double k = cycle_cost_ / counted_in_cycle;
    per_counted_ = per_counted_ == 0 ? k : 0.7 * per_counted_ + 0.3 * k;
  }
  cycle_counted_at_start_ = counted_seconds(now);
  // What began in a share-1 cycle may still end with the probes attached.
  if (share_ >= 1.0) grace_until_ = std::max(grace_until_, now + options_.grace_seconds);
  cycle_cost_ = 0;
  cycle_on_seconds_at_start_ = on_seconds(now);
}

void DutyCycle::PlanCycle(double now) {
  // What to spend per second: the budget, plus the balance paid back over
  // repay_seconds, never less than half the budget (a burst overspent
  // must not leave the probes at the floor for long).
  const double spend =
      std::clamp(options_.budget + balance_ / options_.repay_seconds, options_.budget / 2, options_.budget * 2);
  const double min_on = options_.min_on_seconds;
  const double toggles = 2 * toggle_avg_;  // per cycle
  // The cost per second counted: measured in sampled cycles; before any,
  // the attached rate over a shortest phase with its grace.
  const double k = per_counted_ > 0 ? per_counted_ : rate_ * (min_on + options_.grace_seconds) / min_on;
  double share = 1.0, cycle = options_.min_cycle_seconds;
  if (rate_ > spend) {
    // Cycles of one shortest phase (min_on / d long), each costing k per
    // second counted plus two toggles: d (k + toggles / min_on) = spend.
    share = spend / (k + toggles / min_on);
    cycle = min_on / share;
    if (cycle < options_.min_cycle_seconds) {
      // Short cycles would toggle too often: cycles of min_cycle, a phase
      // longer than the shortest (k then overstates: on the safe side).
      cycle = options_.min_cycle_seconds;
      share = std::clamp((spend * cycle - toggles) / (k * cycle), min_on / cycle, 1.0);
      if (share > 0.9) share = 1.0;  // toggling would save little
    } else if (cycle > options_.max_cycle_seconds) {
      // At least one shortest phase per longest cycle: a cycle with no
      // phase would leave its events with no estimate at all.
      cycle = options_.max_cycle_seconds;
      share = min_on / cycle;
    }
  }
  share_ = share;
  cycle_start_ = now;
  cycle_end_ = now + cycle;
  // The phase starts anywhere in the cycle and wraps around its end to
  // its start, so every moment of the cycle is counted with the same
  // chance (a phase kept inside would cover the cycle's middle more often).
  const double on_length = share_ * cycle;
  std::uniform_real_distribution<double> offset(0.0, cycle);
  const double u = share_ >= 1.0 ? 0.0 : offset(random_);
  on_begin_ = now + u;
  on_end_ = std::min(now + u + on_length, cycle_end_);
  wrap_end_ = now + std::max(0.0, u + on_length - cycle);
}

bool DutyCycle::Wanted(double now) const {
  if (share_ >= 1.0 || now < grace_until_) return true;
  const double grace = options_.grace_seconds;
  if (now >= on_begin_ && now < on_end_ + grace) return true;
  return wrap_end_ > cycle_start_ && now >= cycle_start_ && now < wrap_end_ + grace;
}

DutyCycle::Action DutyCycle::Tick(double now, double cost, double weighted) {
  FoldUncounted(now);  // before the gate moves on
  const double dt = std::max(0.0, now - last_now_);
  last_now_ = now;
  const double spent = last_cost_ < 0 ? 0.0 : std::max(0.0, cost - last_cost_);
  last_cost_ = cost;
  cost_ += spent;
  // All of it: what is spent while off is a detach still under way.
  cycle_cost_ += spent;
  if (options_.budget <= 0) return Action::kNone;
  // Savings are kept for the cycle under way (its phase may come late in
  // it) and one shortest cycle more: a quiet hour must not pay for a later
  // burst at twice the budget. Overspending is repaid.
  balance_ = std::min(balance_ + options_.budget * dt - spent,
                      options_.budget * (cycle_end_ - cycle_start_ + options_.min_cycle_seconds));
  // The grace of a phase part that ends at the cycle's end reaches into
  // the next cycle.
  if (on_ && share_ < 1.0 && on_end_ >= cycle_end_ && now >= on_begin_) {
    grace_until_ = std::max(grace_until_, on_end_ + options_.grace_seconds);
  }
  // A share-1 cycle ends as soon as it has spent a whole cycle's budget:
  // everything in it counted, so ending it early biases nothing.
  if ((share_ >= 1.0 && cycle_cost_ > options_.budget * options_.min_cycle_seconds) || now >= cycle_end_) {
    EndCycle(now, weighted);
    PlanCycle(now);
  }
  const bool want = Wanted(now);
  if (want == on_) return Action::kNone;
  return want ? Action::kAttach : Action::kDetach;
}

double DutyCycle::next_change() const {
  double next = cycle_end_;
  const double grace = options_.grace_seconds;
  for (double t : {on_begin_, on_end_, on_end_ + grace, wrap_end_, wrap_end_ + grace, grace_until_}) {
    if (t > last_now_ && t < next) next = t;
  }
  return next;
}

double DutyCycle::next_tick() const {
  double next = std::min(next_change(), last_now_ + options_.idle_tick_seconds);
  if (options_.budget > 0 && on_ && share_ >= 1.0) {
    const double left = std::max(0.0, options_.budget * options_.min_cycle_seconds - cycle_cost_);
    const double watch =
        std::clamp(left / (4 * std::max(rate_, options_.budget)), options_.watch_seconds, options_.max_watch_seconds);
    next = std::min(next, last_now_ + watch);
  }
  return next;
}

void DutyCycle::Toggled(double now, bool on, double toggle_cost) {
  if (on == on_) return;
  FoldUncounted(now);
  toggle_cost_ += toggle_cost;
  balance_ -= toggle_cost;
  toggle_avg_ = toggles_ == 0 ? toggle_cost : 0.8 * toggle_avg_ + 0.2 * toggle_cost;
  ++toggles_;
  if (on) {
    on_since_ = now;
  } else {
    on_total_ += std::max(0.0, now - on_since_);
  }
  on_ = on;
}

DutyCycle::Gate DutyCycle::gate(double now) const {
  Gate g;
  if (options_.budget <= 0 || share_ >= 1.0) {
    g.open = 0;
    g.close = std::numeric_limits<double>::infinity();
    return g;
  }
  // The planned part of the on-phase that holds `now`.
  double begin = 0, end = 0;
  if (now >= on_begin_ && now < on_end_) {
    begin = on_begin_;
    end = on_end_;
  } else if (now >= cycle_start_ && now < wrap_end_) {
    begin = cycle_start_;
    end = wrap_end_;
  } else {
    return g;  // closed
  }
  if (!on_) return g;  // not attached yet
  const double open = std::max(begin, on_since_);
  if (end - open <= 1e-3) return g;
  g.open = open;
  g.close = end;
  g.weight = (1.0 / share_) * (end - begin) / (end - open);
  return g;
}

double DutyCycle::pending_variance(double now, double weighted) const {
  if (share_ >= 1.0 || options_.budget <= 0) return 0;
  const double elapsed = now - cycle_start_;
  if (elapsed <= 0) return 0;
  const double e = std::max(0.0, weighted - cycle_weighted_start_);
  const double binomial = e * (1.0 / share_ - 1.0);
  if (!have_prev_) return binomial;
  // Against what the cycle before says the part elapsed holds: a phase
  // not reached yet counted nothing for it, one passed counted it all.
  const double diff = e - elapsed * prev_rate_;
  const double d2 = diff * diff;
  return std::max(binomial, d2) + (prev_sampled_ ? std::max(0.0, d2 - prev_variance_) : 0.0);
}

double DutyCycle::uncounted_seconds(double now) const {
  // Plus the attached time since the last fold that the gate then leaves
  // out (none in a share-1 cycle, whose gate is always open).
  if (!on_) return uncounted_;
  const double from = std::max(uncounted_at_, on_since_);
  if (now <= from) return uncounted_;
  const Gate g = gate(from);
  if (!std::isfinite(g.close)) return uncounted_;
  const double inside = std::max(0.0, std::min(now, g.close) - std::max(from, g.open));
  return uncounted_ + (now - from) - inside;
}

void DutyCycle::FoldUncounted(double now) {
  uncounted_ = uncounted_seconds(now);
  uncounted_at_ = std::max(uncounted_at_, now);
}

double DutyCycle::counted_seconds(double now) const { return on_seconds(now) - uncounted_seconds(now); }

double DutyCycle::on_seconds(double now) const { return on_total_ + (on_ ? std::max(0.0, now - on_since_) : 0.0); }

double DutyCycle::allowed_seconds(double now) const {
  return options_.budget <= 0 ? 0.0 : options_.budget * std::max(0.0, now - start_);
}

}  // namespace tlsprof::usage
