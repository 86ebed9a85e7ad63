// A window as JSON and back: the recording that tests replay through every
// sink (tests/golden), and what `--record-window FILE` writes. Every field
// of a Window round-trips; algorithm names are interned, so a replayed
// window's string_views stay valid for the life of the process.
// Pure functions; thread-safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "agent/profiler/window.h"
#include "common/result.h"

namespace tlsprof::profiler {

inline constexpr std::string_view kWindowRecordSchema = "tlsprof.window.v1";

nlohmann::json RecordWindow(const Window& window);
// A clear error (what is wrong, where) for a document that is not a recording.
Result<Window> ReplayWindow(const nlohmann::json& record);

// The same through a file.
Status WriteWindowRecord(const std::string& path, const Window& window);
Result<Window> ReadWindowRecord(const std::string& path);

}  // namespace tlsprof::profiler
