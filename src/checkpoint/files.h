#pragma once

// Internal: the few file-system operations checkpoints need, on POSIX.
//
// NOTE: not std::filesystem: libtorch.so (PyPI torch 2.11) exports its own
// statically linked copy of std::filesystem, which the dynamic linker binds
// lamp's calls to, and its remove_all() jumps to a null function.

#include <string>
#include <vector>

namespace lamp::detail {

bool is_regular_file(const std::string& path);
bool is_directory(const std::string& path);
/// `mkdir -p`; throws `c10::Error` saying why it failed.
void make_directories(const std::string& path);
/// The names in folder `dir` (not "." and ".."); empty if it cannot be read.
std::vector<std::string> list_directory(const std::string& dir);
/// Removes a file; quietly does nothing if it is gone.
void remove_file(const std::string& path);
/// The folder part of `path` ("." when it has none) and the file name.
std::string parent_of(const std::string& path);
std::string file_name_of(const std::string& path);

} // namespace lamp::detail
