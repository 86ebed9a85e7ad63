#include "agent/report/exports.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <map>
#include <unordered_map>

#include "pprof/profile.pb.h"

namespace tlsprof::report {
namespace {

std::string_view CommOf(const aggregate::Attribution& profile, pid_t pid) {
  auto it = profile.processes.find(pid);
  return it == profile.processes.end() ? std::string_view("?") : std::string_view(it->second.comm);
}

// Folded format separates frames with ';' and ends with ' count': neither may
// appear inside a frame.
std::string FoldedFrame(std::string_view name) {
  std::string out(name);
  for (char& c : out) {
    if (c == ';' || c == ' ' || c == '\n') c = '_';
  }
  return out;
}

// Interns strings into a pprof string table.
class StringTable {
 public:
  explicit StringTable(pprof::Profile* profile) : profile_(profile) { Id(""); }
  int64_t Id(std::string_view s) {
    auto it = ids_.find(std::string(s));
    if (it != ids_.end()) return it->second;
    int64_t id = profile_->string_table_size();
    profile_->add_string_table(std::string(s));
    ids_.emplace(std::string(s), id);
    return id;
  }

 private:
  pprof::Profile* profile_;
  std::unordered_map<std::string, int64_t> ids_;
};

}  // namespace

std::string FoldedStacks(const aggregate::Attribution& profile) {
  // Equal folded lines (same frames and labels from different raw stacks) are
  // merged, and the output is sorted, so that files diff cleanly.
  std::map<std::string, uint64_t> lines;
  for (const auto& s : profile.stacks) {
    std::string line =
        fmt::format("{}_{};[{}];[{} {}]", FoldedFrame(CommOf(profile, s.pid)), s.pid, classify::PhaseName(s.phase),
                    classify::BucketName(s.classification.bucket), FoldedFrame(s.classification.algorithm));
    // append() rather than ";" + ...: gcc 12 at -O3 warns falsely (-Wrestrict, GCC PR 105329).
    for (auto it = s.frames.rbegin(); it != s.frames.rend(); ++it) line.append(";").append(FoldedFrame(*it));
    lines[line] += s.samples;
  }
  std::string out;
  for (const auto& [line, count] : lines) out += fmt::format("{} {}\n", line, count);
  return out;
}

std::string PprofProfile(const aggregate::Attribution& profile, uint64_t period_ns, int64_t start_unix_ns,
                         double duration_seconds) {
  pprof::Profile p;
  StringTable strings(&p);
  auto* samples_type = p.add_sample_type();
  samples_type->set_type(strings.Id("samples"));
  samples_type->set_unit(strings.Id("count"));
  auto* cpu_type = p.add_sample_type();
  cpu_type->set_type(strings.Id("cpu"));
  cpu_type->set_unit(strings.Id("nanoseconds"));
  p.mutable_period_type()->set_type(strings.Id("cpu"));
  p.mutable_period_type()->set_unit(strings.Id("nanoseconds"));
  p.set_period(static_cast<int64_t>(period_ns));
  p.set_default_sample_type(1);
  p.set_duration_nanos(static_cast<int64_t>(duration_seconds * 1e9));
  p.set_time_nanos(start_unix_ns);

  // One function and one location per distinct frame name: the export is
  // symbolic (addresses are process-specific and stay in the agent).
  std::unordered_map<std::string, uint64_t> location_of;
  auto location = [&](const std::string& name) {
    auto it = location_of.find(name);
    if (it != location_of.end()) return it->second;
    uint64_t id = location_of.size() + 1;
    auto* fn = p.add_function();
    fn->set_id(id);
    fn->set_name(strings.Id(name));
    fn->set_system_name(fn->name());
    auto* loc = p.add_location();
    loc->set_id(id);
    loc->add_line()->set_function_id(id);
    location_of.emplace(name, id);
    return id;
  };
  const int64_t k_bucket = strings.Id("bucket"), k_algorithm = strings.Id("algorithm"), k_phase = strings.Id("phase"),
                k_comm = strings.Id("comm"), k_pid = strings.Id("pid");
  for (const auto& s : profile.stacks) {
    auto* sample = p.add_sample();
    for (const auto& frame : s.frames) sample->add_location_id(location(frame));
    sample->add_value(static_cast<int64_t>(s.samples));
    sample->add_value(static_cast<int64_t>(s.samples * period_ns));
    auto label = [&](int64_t key, std::string_view value) {
      auto* l = sample->add_label();
      l->set_key(key);
      l->set_str(strings.Id(value));
    };
    label(k_bucket, classify::BucketName(s.classification.bucket));
    label(k_algorithm, s.classification.algorithm);
    label(k_phase, classify::PhaseName(s.phase));
    label(k_comm, CommOf(profile, s.pid));
    auto* pid = sample->add_label();
    pid->set_key(k_pid);
    pid->set_num(s.pid);
  }
  return p.SerializeAsString();
}

Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !out.flush()) {
    return MakeError("cannot write {}", path);
  }
  return OkStatus();
}

}  // namespace tlsprof::report
