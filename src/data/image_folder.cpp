#include <lamp/data/image_folder.h>

#include <c10/util/Exception.h>

#include <dirent.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "image_folder_detail.h"

// Note [ImageFolder as Python lists it]
// torchvision builds the list from os.scandir, os.walk, os.path.join and
// sorted() on str. Each helper below is the POSIX equivalent of one of
// those, making the same system calls (opendir/readdir, stat only where
// Python's DirEntry.is_dir() stats), so that even odd trees (symbolic link
// cycles, broken links, undecodable names) give Python's list.
//
// NOTE: not std::filesystem: libtorch.so exports a broken copy of it (see
// src/checkpoint/files.h).

namespace lamp::data {
namespace {

// --- Python's str and os.path on POSIX ---------------------------------------

// The code points of Python's `os.fsdecode(name)`: strict UTF-8, each byte
// of an invalid sequence mapped to the surrogate U+DC00 + byte
// (surrogateescape). Sorting these sorts as Python sorts the names.
std::u32string python_str(const std::string& bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  const auto byte = [&](size_t i) -> uint32_t {
    return i < bytes.size() ? static_cast<unsigned char>(bytes[i]) : 0u;
  };
  const auto cont = [&](size_t i, uint32_t lo = 0x80, uint32_t hi = 0xBF) {
    return i < bytes.size() && byte(i) >= lo && byte(i) <= hi;
  };
  size_t i = 0;
  while (i < bytes.size()) {
    const uint32_t b = byte(i);
    size_t n = 0; // length of a valid sequence at i, 0 if none
    if (b < 0x80) {
      n = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = cont(i + 1) ? 2 : 0;
    } else if (b >= 0xE0 && b <= 0xEF) {
      const uint32_t lo = b == 0xE0 ? 0xA0 : 0x80;
      const uint32_t hi = b == 0xED ? 0x9F : 0xBF;
      n = cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
    } else if (b >= 0xF0 && b <= 0xF4) {
      const uint32_t lo = b == 0xF0 ? 0x90 : 0x80;
      const uint32_t hi = b == 0xF4 ? 0x8F : 0xBF;
      n = cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (n == 0) {
      out.push_back(0xDC00 + b);
      ++i;
      continue;
    }
    uint32_t c = n == 1 ? b : b & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) {
      c = (c << 6) | (byte(i + k) & 0x3F);
    }
    out.push_back(c);
    i += n;
  }
  return out;
}

// sorted(names) on Python strs.
void python_sort(std::vector<std::string>& names) {
  std::vector<std::pair<std::u32string, std::string>> keyed;
  keyed.reserve(names.size());
  for (auto& name : names) {
    keyed.emplace_back(python_str(name), std::move(name));
  }
  std::sort(keyed.begin(), keyed.end());
  for (size_t i = 0; i < keyed.size(); ++i) {
    names[i] = std::move(keyed[i].second);
  }
}

// os.path.join(a, b) for a `b` that does not start with '/'.
std::string path_join(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') {
    return a + b;
  }
  return a + "/" + b;
}

// os.path.expanduser.
std::string expand_user(const std::string& path) {
  if (path.empty() || path[0] != '~') {
    return path;
  }
  auto i = path.find('/', 1);
  if (i == std::string::npos) {
    i = path.size();
  }
  std::string home;
  if (i == 1) {
    if (const char* env = std::getenv("HOME")) {
      home = env;
    } else if (const passwd* pw = ::getpwuid(::getuid())) {
      home = pw->pw_dir;
    } else {
      return path;
    }
  } else {
    const passwd* pw = ::getpwnam(path.substr(1, i - 1).c_str());
    if (pw == nullptr) {
      return path;
    }
    home = pw->pw_dir;
  }
  while (!home.empty() && home.back() == '/') {
    home.pop_back();
  }
  const auto expanded = home + path.substr(i);
  return expanded.empty() ? "/" : expanded;
}

// One entry of os.scandir(dir): its name and DirEntry.is_dir(), which
// trusts d_type unless it is a link or unknown, and otherwise stats
// (following links): false for a missing target, errno in `stat_error`
// for other failures (Python raises OSError there).
struct DirEntry {
  std::string name;
  bool is_dir = false;
  int stat_error = 0;
};

// os.scandir(dir) read to the end; returns 0 or the errno of opendir.
int scan_directory(const std::string& dir, std::vector<DirEntry>& entries) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return errno;
  }
  while (const dirent* e = ::readdir(d)) {
    DirEntry entry;
    entry.name = e->d_name;
    if (entry.name == "." || entry.name == "..") {
      continue;
    }
    if (e->d_type != DT_UNKNOWN && e->d_type != DT_LNK) {
      entry.is_dir = e->d_type == DT_DIR;
    } else {
      struct stat st {};
      if (::stat(path_join(dir, entry.name).c_str(), &st) == 0) {
        entry.is_dir = S_ISDIR(st.st_mode);
      } else if (errno != ENOENT) {
        entry.stat_error = errno;
      }
    }
    entries.push_back(std::move(entry));
  }
  ::closedir(d);
  return 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// --- torchvision's find_classes and make_dataset -----------------------------

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) {
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

std::vector<std::string> find_classes(const std::string& root) {
  std::vector<DirEntry> entries;
  const int error = scan_directory(root, entries);
  TORCH_CHECK(
      error != ENOENT,
      "ImageFolder: the root folder ",
      root,
      " does not exist; pass the folder that holds one sub-folder per class");
  TORCH_CHECK(
      error != ENOTDIR,
      "ImageFolder: the root ",
      root,
      " is not a folder; pass the folder that holds one sub-folder per class");
  TORCH_CHECK(
      error == 0,
      "ImageFolder: cannot read the root folder ",
      root,
      ": ",
      std::strerror(error));
  std::vector<std::string> classes;
  for (const auto& entry : entries) {
    TORCH_CHECK(
        entry.stat_error == 0,
        "ImageFolder: cannot tell whether ",
        path_join(root, entry.name),
        " is a folder: ",
        std::strerror(entry.stat_error),
        "; fix or remove it");
    if (entry.is_dir) {
      classes.push_back(entry.name);
    }
  }
  TORCH_CHECK(
      !classes.empty(),
      "Couldn't find any class folder in ",
      root,
      ". ImageFolder expects one sub-folder per class, holding that class's "
      "files: root/<class>/<file>");
  python_sort(classes);
  return classes;
}

// sorted(os.walk(top, followlinks=True)): every folder's path and its
// non-folder entries, sorted by path. Folders that cannot be read are
// skipped, as os.walk skips them without onerror.
std::vector<std::pair<std::string, std::vector<std::string>>> walk(
    const std::string& top) {
  std::vector<std::pair<std::u32string, size_t>> order;
  std::vector<std::pair<std::string, std::vector<std::string>>> folders;
  std::vector<std::string> stack{top};
  while (!stack.empty()) {
    std::string dir = std::move(stack.back());
    stack.pop_back();
    std::vector<DirEntry> entries;
    if (scan_directory(dir, entries) != 0) {
      continue;
    }
    std::vector<std::string> files;
    for (auto& entry : entries) {
      if (entry.is_dir) {
        stack.push_back(path_join(dir, entry.name));
      } else {
        files.push_back(std::move(entry.name));
      }
    }
    order.emplace_back(python_str(dir), folders.size());
    folders.emplace_back(std::move(dir), std::move(files));
  }
  std::sort(order.begin(), order.end());
  std::vector<std::pair<std::string, std::vector<std::string>>> sorted;
  sorted.reserve(folders.size());
  for (const auto& [key, i] : order) {
    sorted.push_back(std::move(folders[i]));
  }
  return sorted;
}

} // namespace

namespace detail {

// `path.lower().endswith(extension)` for each extension. Lower-cases ASCII
// and the Kelvin sign (U+212A, UTF-8 E2 84 AA), the only non-ASCII
// character whose lower case is ASCII: exact for ASCII extensions.
bool has_allowed_extension(
    const std::string& path,
    const std::vector<std::string>& extensions) {
  std::string lower;
  lower.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path.compare(i, 3, "\xE2\x84\xAA") == 0) {
      lower.push_back('k');
      i += 2;
    } else {
      const char c = path[i];
      lower.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c);
    }
  }
  for (const auto& extension : extensions) {
    if (lower.size() >= extension.size() &&
        lower.compare(
            lower.size() - extension.size(), extension.size(), extension) ==
            0) {
      return true;
    }
  }
  return false;
}

} // namespace detail

std::vector<std::string> image_extensions() {
  return {
      ".jpg",
      ".jpeg",
      ".png",
      ".ppm",
      ".bmp",
      ".pgm",
      ".tif",
      ".tiff",
      ".webp"};
}

std::vector<std::string> decodable_image_extensions() {
  return {".jpg", ".jpeg", ".png"};
}

ImageFolder::ImageFolder(std::string root, ImageFolderOptions options)
    : root_(expand_user(root)) {
  classes_ = find_classes(root_);
  for (size_t i = 0; i < classes_.size(); ++i) {
    class_to_idx_[classes_[i]] = static_cast<int64_t>(i);
  }
  const auto& valid = options.is_valid_file();
  std::vector<std::string> empty;
  for (size_t index = 0; index < classes_.size(); ++index) {
    const auto class_dir = path_join(root_, classes_[index]);
    const auto before = samples_.size();
    if (is_directory(class_dir)) {
      for (auto& [dir, files] : walk(class_dir)) {
        python_sort(files);
        for (const auto& file : files) {
          auto path = path_join(dir, file);
          if (valid
                  ? valid(path)
                  : detail::has_allowed_extension(path, options.extensions())) {
            samples_.push_back({std::move(path), static_cast<int64_t>(index)});
          }
        }
      }
    }
    if (samples_.size() == before) {
      empty.push_back(classes_[index]);
    }
  }
  if (!empty.empty() && !options.allow_empty()) {
    // NOTE: Python's message, then what to do.
    std::string message =
        "Found no valid file for the classes " + join_names(empty) + ". ";
    if (!valid) {
      message +=
          "Supported extensions are: " + join_names(options.extensions()) +
          " (lamp's loader decodes " +
          join_names(decodable_image_extensions()) + " of them). ";
    }
    TORCH_CHECK(
        false,
        message,
        "Put files in them, remove them, or keep them as classes without "
        "samples with ImageFolderOptions().allow_empty(true)");
  }
}

std::vector<int64_t> ImageFolder::targets() const {
  std::vector<int64_t> targets;
  targets.reserve(samples_.size());
  for (const auto& sample : samples_) {
    targets.push_back(sample.target);
  }
  return targets;
}

const ImageFolder::Sample& ImageFolder::operator[](size_t index) const {
  TORCH_CHECK_INDEX(
      index < samples_.size(),
      "ImageFolder index ",
      index,
      " is out of range: the dataset has ",
      samples_.size(),
      " samples");
  return samples_[index];
}

} // namespace lamp::data
