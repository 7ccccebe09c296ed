#pragma once

// Internal: ImageFolder's extension test, shared with ImageLoader (which
// refuses folders holding formats it cannot decode).

#include <string>
#include <vector>

namespace lamp::data::detail {

// Python's `path.lower().endswith(tuple(extensions))`, exact for ASCII
// extensions.
bool has_allowed_extension(
    const std::string& path,
    const std::vector<std::string>& extensions);

} // namespace lamp::data::detail
