// Reading /proc: a process's memory mappings, its name, and the files behind
// its mappings. Pure parsing is separated from I/O so it can be unit-tested.
// All functions are thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/guard/guarded_file.h"
#include "common/fd.h"
#include "common/result.h"

namespace tlsprof::discovery {

struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t offset = 0;  // file offset of `start` (pgoff)
  uint32_t dev_major = 0;
  uint32_t dev_minor = 0;
  uint64_t inode = 0;
  bool executable = false;
  bool deleted = false;  // the kernel appended " (deleted)": the file was unlinked or replaced
  // Without " (deleted)". The kernel prints it relative to the READER's root:
  // the path inside a container with its own mount namespace (pivot_root),
  // but the host's path for a process in a plain chroot (guard::ProcessRoot).
  std::string path;

  bool contains(uint64_t addr) const { return addr >= start && addr < end; }
  bool is_file() const { return inode != 0 && !path.empty() && path.front() == '/'; }
};

// Parses the text of /proc/PID/maps. Malformed lines give an Error naming the
// line; an empty text gives an empty list.
Result<std::vector<Mapping>> ParseMaps(std::string_view text);

// The executable file mappings of a process, which are what samples are
// named from. /proc/PID/maps is the process's to shape (its path names, and
// up to vm.max_map_count mappings): it is read in chunks, at most
// guard::kMaxMapsBytes of it, and at most guard::kMaxExecMappings executable
// file mappings are kept; past either the rest is left out and `cut` says so
// (counted as guard::Reason::kMaps). Other lines are parsed and dropped.
struct ExecMaps {
  std::vector<Mapping> mappings;  // in the file's order (by address)
  bool cut = false;
};
Result<ExecMaps> ReadExecMaps(pid_t pid, const std::string& proc_root = "/proc");

// The process's command name (/proc/PID/comm), or "" if it is gone.
std::string ReadComm(pid_t pid, const std::string& proc_root = "/proc");

// The mapping as the guarded opener takes it (guard::OpenMapping: map_files,
// else the path inside the process's root, the mapped inode either way).
guard::MappedFileRef MappedFileOf(pid_t pid, const Mapping& mapping);

// Which process a pid names, and which program it runs: pids are reused
// (pid_max wraps, or a pid namespace hands out low pids again), and a process
// that calls execve keeps its pid and start time but maps another program.
// Two reads of one pid that differ name two processes, or one process before
// and after an exec.
struct ProcessIdentity {
  uint64_t start_time = 0;  // clock ticks after boot (/proc/PID/stat field 22)
  // The executable's st_dev, st_ino (stat of /proc/PID/exe). 0 when there is
  // none to read: a kernel thread, and a process that is exiting (from its
  // exit until its parent reaps it, it has no address space, no exe and
  // empty maps, while its stat still reads the same start time).
  uint64_t exe_dev = 0;
  uint64_t exe_inode = 0;

  bool operator==(const ProcessIdentity&) const = default;
  bool has_exe() const { return exe_dev != 0 || exe_inode != 0; }
  // Whether `now`, read later of the same pid, names another process or
  // program: another start time (pid reuse), or another executable (exec).
  // An executable that cannot be read now proves nothing: the process may
  // only be exiting, and an exec always leaves one to read.
  bool ReplacedBy(const ProcessIdentity& now) const {
    return now.start_time != start_time ||
           (has_exe() && now.has_exe() && (now.exe_dev != exe_dev || now.exe_inode != exe_inode));
  }
};

// The start time (field 22) from the text of /proc/PID/stat. The command name
// (field 2) may hold spaces and parentheses: the fields are counted after its
// last ')'.
Result<uint64_t> ParseStatStartTime(std::string_view text);

// Reads /proc/PID/stat and /proc/PID/exe. An Error when the process is gone.
Result<ProcessIdentity> ReadProcessIdentity(pid_t pid, const std::string& proc_root = "/proc");

// Every numeric entry of /proc.
std::vector<pid_t> ListPids(const std::string& proc_root = "/proc");

}  // namespace tlsprof::discovery
