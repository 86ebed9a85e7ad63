// The status page's files (collector/expose/web/ and Chart.js), compiled into
// the binary by cmake/EmbedWebAssets.cmake. Immutable: thread-safe.
#pragma once

#include <span>
#include <string_view>

namespace tlsprof::collector {

struct WebAsset {
  std::string_view path;          // the URL path it is served at
  std::string_view content_type;  // from the file's extension
  std::string_view body;
};

std::span<const WebAsset> WebAssets();

}  // namespace tlsprof::collector
