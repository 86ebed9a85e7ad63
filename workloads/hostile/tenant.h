// The hostile tenant's processes (tests/integration/test_hostile.py): what an
// unprivileged process inside a container does to the files it maps and to
// its own address space so that a host-wide profiler reading them stalls,
// crashes or runs out of memory. They map files as the dynamic loader lays
// them out but never relocate or run that code: the CPU they burn is in this
// program's own code, which is all the profiler needs to find them.
//
// Each Run* function writes `ready` (atomically) once its files are mapped,
// runs until SIGTERM/SIGINT or `seconds` (<= 0: until a signal), and returns
// the process's exit code; `status`, if given, gets a JSON object of what it
// did, rewritten as it goes. They fork helpers and reap them; a signal stops
// them all. Single-threaded callers only (one per process).
#pragma once

#include <string>
#include <vector>

namespace tlsprof::hostile {

struct Common {
  std::vector<std::string> map;  // files mapped for the whole run (a TLS library makes the process a TLS one)
  double seconds = 0;
  double duty = 0.5;  // share of each 20 ms slice spent burning CPU
  std::string ready;
  std::string status;
};

// Maps `common.map` and burns CPU.
int RunTenant(const Common& common);

// Round after round (a child process each): a fresh copy of `library` in
// `dir`/rN/ is mapped executable below `fillers` one-page mappings of another
// copy, and watched with inotify. When the profiler opens the copy (it read
// the child's maps and is loading what they list), the child deletes it, puts
// a FIFO at its path and unmaps it, then keeps burning CPU for `hold` seconds:
// the profiler's snapshot still lists the range, and opening "the mapped file"
// by its path then opens the FIFO. Status: rounds, and how many saw the
// profiler's open and swapped.
int RunFifoSwap(const Common& common, const std::string& library, const std::string& dir, int fillers, double hold);

// Copies `library` to `path`, then one helper truncates it to 0 and writes it
// back in a loop while a new child maps it every `spawn_ms` (and burns CPU
// for a while): each new process makes the profiler load the file again, and
// the file shrinks under it while it reads. Status: mappers started and
// rewrites done.
int RunTruncateLoop(const Common& common, const std::string& library, const std::string& path, int spawn_ms);

// Maps one page of `file`'s executable segment `count` times at distinct,
// non-adjacent addresses (each its own line in /proc/PID/maps).
int RunManyMaps(const Common& common, const std::string& file, int count);

}  // namespace tlsprof::hostile
