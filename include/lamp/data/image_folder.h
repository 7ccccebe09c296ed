#pragma once

// The file list of an image classification dataset stored as
// root/<class>/.../<image>: torchvision's ImageFolder (torchvision 0.26,
// torchvision/datasets/folder.py), rule for rule.

#include <torch/arg.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <lamp/export.h>

namespace lamp::data {

/// torchvision's `IMG_EXTENSIONS`: ".jpg", ".jpeg", ".png", ".ppm", ".bmp",
/// ".pgm", ".tif", ".tiff", ".webp", in that order.
LAMP_API std::vector<std::string> image_extensions();

/// The extensions of the formats lamp::data's loader decodes (JPEG, PNG):
/// ".jpg", ".jpeg", ".png". `ImageFolderOptions().extensions(
/// decodable_image_extensions())` leaves other images out of a folder,
/// which ImageLoader otherwise refuses (it decodes by content: a PNG named
/// .jpg is fine).
LAMP_API std::vector<std::string> decodable_image_extensions();

/// Options of `ImageFolder`; defaults are those of torchvision's
/// `ImageFolder`.
struct LAMP_API ImageFolderOptions {
  /// A file is a sample when its path, lower-cased, ends with one of these
  /// (compared as given: write them in lower case). torchvision's
  /// `DatasetFolder(extensions=...)`. Default: `image_extensions()`.
  TORCH_ARG(std::vector<std::string>, extensions) = image_extensions();
  /// When set, decides instead of `extensions` whether a file (its path,
  /// as in `samples()`) is a sample, as torchvision's `is_valid_file`
  /// (ImageFolder then ignores the extensions). Default: none.
  TORCH_ARG(std::function<bool(const std::string&)>, is_valid_file) = nullptr;
  /// Keep class folders without any sample as classes (they get an index
  /// and no sample) instead of throwing. Default: false.
  TORCH_ARG(bool, allow_empty) = false;
};

/// The classes and samples of a dataset laid out as
/// `root/<class>/[subfolders/]<file>`, exactly as torchvision's
/// `ImageFolder(root)` lists them; no image is opened.
///
/// - `root` goes through `os.path.expanduser` ("~", "~user").
/// - `classes()`: the names of root's entries that are folders (symbolic
///   links followed; names starting with "." included, as `os.scandir`
///   lists them), sorted as Python sorts `str`s (by code point, which for
///   UTF-8 names is byte order; undecodable bytes sort as Python's
///   surrogate escapes). `class_to_idx()` numbers them in that order.
/// - `samples()`: for each class in order, every folder below it
///   (`os.walk(..., followlinks=True)`: symbolic links followed, a
///   symbolic link cycle walked until the system refuses the path, as in
///   Python), folders sorted by their full path string, then each folder's
///   non-folder entries sorted by name; a file is kept when it passes
///   `is_valid_file` or, without one, has one of `extensions`. Paths are
///   joined as `os.path.join(root, class, ...)` joins them, so they equal
///   torchvision's `dataset.samples` as strings.
///
/// Throws `c10::Error` when root does not exist or is not a folder, has no
/// class folder ("Couldn't find any class folder in ..."), or, unless
/// `allow_empty`, when a class has no sample ("Found no valid file for the
/// classes ...", torchvision's message).
///
/// Not replicated: lower-casing for the extension test is ASCII's (plus
/// the Kelvin sign, the one non-ASCII character Python lowers to ASCII),
/// so an extension with a non-ASCII letter matches file names case
/// sensitively, where Python's `str.lower()` would also lower "Ä" to "ä".
/// Python's recursive `os.walk` raises RecursionError below about 1000
/// nested folders; lamp walks any depth. Loading images (torchvision's
/// `loader`, `transform`) is not part of this class.
///
/// Example:
/// \code
///   lamp::data::ImageFolder train("/data/imagenet/train");
///   std::cout << train.classes().size() << " classes, " << train.size()
///             << " images\n";
///   const auto& [path, target] = train[0];  // first image, its class index
/// \endcode
class LAMP_API ImageFolder {
 public:
  /// One sample: the file's path and its class index.
  struct Sample {
    std::string path;
    int64_t target;
  };

  explicit ImageFolder(std::string root, ImageFolderOptions options = {});

  /// The root, after "~" expansion (torchvision's `root`).
  const std::string& root() const {
    return root_;
  }
  /// The class names, sorted (torchvision's `classes`).
  const std::vector<std::string>& classes() const {
    return classes_;
  }
  /// Class name → index in `classes()` (torchvision's `class_to_idx`).
  const std::map<std::string, int64_t>& class_to_idx() const {
    return class_to_idx_;
  }
  /// Every sample in order (torchvision's `samples` and `imgs`).
  const std::vector<Sample>& samples() const {
    return samples_;
  }
  /// The class index of every sample (torchvision's `targets`).
  std::vector<int64_t> targets() const;
  /// The number of samples (Python's `len(dataset)`).
  size_t size() const {
    return samples_.size();
  }
  /// Sample `index`; throws `c10::IndexError` when out of range.
  const Sample& operator[](size_t index) const;

 private:
  std::string root_;
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<Sample> samples_;
};

} // namespace lamp::data
