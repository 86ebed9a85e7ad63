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

// The window's TLS stacks written to `path`: folded stacks (flamegraph.pl)
// or a pprof profile (go tool pprof), exports.h.
class StacksWriter : public profiler::WindowSink {
 public:
  enum class Format { kFolded, kPprof };
  StacksWriter(Format format, std::string path) : format_(format), path_(std::move(path)) {}
  Status Consume(const profiler::Window& window) override;

 private:
  Format format_;
  std::string path_;
};

}  // namespace tlsprof::report
