#include "agent/report/sinks.h"

#include <fstream>
#include <iostream>

#include "agent/report/exports.h"
#include "agent/report/report.h"

namespace tlsprof::report {

Status ReportWriter::Consume(const profiler::Window& window) {
  const nlohmann::json doc = BuildReport(window);
  const std::string text = format_.format == "json" ? doc.dump(2) + "\n" : RenderTable(doc, format_.table);
  if (format_.output.empty() || format_.output == "-") {
    std::cout << text << std::flush;
    return OkStatus();
  }
  std::ofstream out(format_.output);
  if (!out || !(out << text) || !out.flush()) return MakeError("cannot write the report to {}", format_.output);
  return OkStatus();
}

Status StacksWriter::Consume(const profiler::Window& window) {
  return WriteFile(path_, format_ == Format::kFolded ? FoldedStacks(window.attribution)
                                                     : PprofProfile(window.attribution, window.host.period_ns,
                                                                    window.start_unix_ns, window.duration_seconds()));
}

}  // namespace tlsprof::report
