// The agent's commands, each a short loop over the same Window: the
// profiler closes a window (agent/profiler) and the command hands it to its
// sinks. `stop` (SIGINT/SIGTERM) ends the window, or the daemon, early; the
// partial window is still reported. Errors at start (a flag, a port in use,
// no privileges) are returned; a later failure of one window is logged.
#pragma once

#include "agent/commands/options.h"
#include "common/stop_signal.h"

namespace tlsprof::commands {

// `profile`: one window of --duration, then the report (table or JSON) and
// the folded/pprof exports.
Status Profile(const Options& options, const StopSignal& stop);

// `demo`: starts the bundled demo TLS workload (tlsprof-demo beside this
// binary), profiles the host while it runs, and stops it.
Status Demo(const Options& options, const StopSignal& stop);

// `run`: a window every --interval for as long as it runs, into the agent's
// /metrics and, with --collector, the shipper (docs/fleet.md, "Agent
// daemon"). At a stop, the partial window is sealed and the shipper gets up
// to --flush seconds to empty the spool.
Status Run(const Options& options, const StopSignal& stop);

}  // namespace tlsprof::commands
