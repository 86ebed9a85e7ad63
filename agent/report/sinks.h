// The one-shot command's sinks (`profile`, `demo`): the report, as a table
// or JSON, and the TLS stacks as folded stacks or pprof, each written to a
// file (or stdout). Not synchronized.
#pragma once

#include <string>

#include "agent/profiler/window.h"
#include "agent/report/report.h"

namespace tlsprof::report {

struct ReportFormat {
  std::string format = "table";  // table or json
  std::string output;            // "" or "-": stdout
  TableOptions table;
};

class ReportWriter : public profiler::WindowSink {
 public:
  explicit ReportWriter(ReportFormat format) : format_(std::move(format)) {}
  Status Consume(const profiler::Window& window) override;

 private:
  ReportFormat format_;
};

// Folded stacks (flamegraph.pl) or a pprof profile (go tool pprof) of the
// window's TLS stacks, written to `path`.
class FoldedWriter : public profiler::WindowSink {
 public:
  explicit FoldedWriter(std::string path) : path_(std::move(path)) {}
  Status Consume(const profiler::Window& window) override;

 private:
  std::string path_;
};

class PprofWriter : public profiler::WindowSink {
 public:
  explicit PprofWriter(std::string path) : path_(std::move(path)) {}
  Status Consume(const profiler::Window& window) override;

 private:
  std::string path_;
};

}  // namespace tlsprof::report
