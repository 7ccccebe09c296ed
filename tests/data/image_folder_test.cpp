#include <lamp/data.h>

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support.h"

// NOTE: the whole file in a namespace of its own: lamp_tests is a unity
// build (LAMP_UNITY_BUILD), and file-local names of different files
// must not meet in one unit.
namespace image_folder_test {

namespace {

using lamp::data::ImageFolder;
using lamp::data::ImageFolderOptions;
using lamp::test::expect_error;

// NOTE: no std::filesystem: libtorch.so exports a broken copy of it (see
// src/checkpoint/files.h).

// A fresh folder under the test temp dir, one per process (ctest runs tests
// in parallel), removed at the end of the test.
class TempTree {
 public:
  explicit TempTree(const std::string& name)
      : dir_(
            testing::TempDir() + "lamp_image_folder_" + name + "_" +
            std::to_string(getpid())) {
    remove();
    EXPECT_EQ(::mkdir(dir_.c_str(), 0755), 0) << dir_;
  }
  ~TempTree() {
    remove();
  }
  TempTree(const TempTree&) = delete;
  TempTree& operator=(const TempTree&) = delete;

  const std::string& dir() const {
    return dir_;
  }
  std::string path(const std::string& relative) const {
    return dir_ + "/" + relative;
  }
  // An empty file (and its folders): ImageFolder opens no image.
  void file(const std::string& relative) const {
    folder(parent(relative));
    const int fd =
        ::open(path(relative).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    EXPECT_GE(fd, 0) << relative;
    ::close(fd);
  }
  void folder(const std::string& relative) const {
    for (size_t at = 0; at <= relative.size(); ++at) {
      if (at == relative.size() || relative[at] == '/') {
        ::mkdir(path(relative.substr(0, at)).c_str(), 0755);
      }
    }
  }
  void symlink(const std::string& target, const std::string& relative) const {
    folder(parent(relative));
    EXPECT_EQ(::symlink(target.c_str(), path(relative).c_str()), 0) << relative;
  }
  void fifo(const std::string& relative) const {
    folder(parent(relative));
    EXPECT_EQ(::mkfifo(path(relative).c_str(), 0644), 0) << relative;
  }

 private:
  static std::string parent(const std::string& relative) {
    const auto slash = relative.rfind('/');
    return slash == std::string::npos ? "" : relative.substr(0, slash);
  }
  void remove() const {
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  std::string dir_;
};

// What the oracle prints, from lamp: "root ROOT", "class INDEX NAME",
// "sample TARGET PATH" (tab-separated), or "error" when lamp throws.
std::vector<std::string> lamp_lines(
    const std::string& root,
    const ImageFolderOptions& options = {}) {
  std::vector<std::string> lines;
  try {
    const ImageFolder folder(root, options);
    lines.push_back("root\t" + folder.root());
    for (const auto& name : folder.classes()) {
      lines.push_back(
          "class\t" + std::to_string(folder.class_to_idx().at(name)) + "\t" +
          name);
    }
    EXPECT_EQ(folder.targets().size(), folder.size());
    for (size_t i = 0; i < folder.size(); ++i) {
      const auto& [path, target] = folder[i];
      EXPECT_EQ(folder.targets()[i], target);
      lines.push_back("sample\t" + std::to_string(target) + "\t" + path);
    }
  } catch (const c10::Error&) {
    lines = {"error"};
  }
  return lines;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) {
      end = text.size();
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// One listing of the oracle: its lines, {"error"} when torchvision raised
// (the message in `error`).
struct Listing {
  std::vector<std::string> lines;
  std::string error;
};

// torchvision's listings of `cases` (each "ROOT [options]", as the oracle
// takes them), in one run of Python; nullopt without torchvision.
std::optional<std::vector<Listing>> python_listings(
    const std::vector<std::pair<std::string, std::string>>& cases) {
  std::string args;
  for (const auto& [root, options] : cases) {
    args += (args.empty() ? "'" : " :: '") + root + "' " + options;
  }
  const auto lines = lines_of(
      lamp::test::run_python_oracle("data/image_folder_oracle.py", args));
  if (lines == std::vector<std::string>{"no torchvision"}) {
    return std::nullopt;
  }
  std::vector<Listing> listings;
  for (const auto& line : lines) {
    if (line.rfind("case\t", 0) == 0) {
      listings.emplace_back();
    } else if (line.rfind("error\t", 0) == 0) {
      EXPECT_FALSE(listings.empty());
      listings.back().lines = {"error"};
      listings.back().error = line.substr(line.find('\t', 6) + 1);
    } else {
      EXPECT_FALSE(listings.empty());
      listings.back().lines.push_back(line);
    }
  }
  EXPECT_EQ(listings.size(), cases.size());
  listings.resize(cases.size());
  return listings;
}

// Skips the test (CTest reports it skipped) without Python or torchvision;
// otherwise sets `listings` to torchvision's listings of `cases`.
#define LIST_WITH_TORCHVISION(listings, ...)                    \
  LAMP_SKIP_WITHOUT_PYTHON_ORACLE();                            \
  const auto listings##_or = python_listings(__VA_ARGS__);      \
  if (!listings##_or) {                                         \
    GTEST_SKIP() << "needs torchvision in the oracle's python"; \
  }                                                             \
  const std::vector<Listing>& listings = *listings##_or

// Names whose order is easy to get wrong: punctuation below and above '/'
// (folders sort by full path: a/b, a/b-c, a/b.c, a/b/d, a/b0), upper
// before lower case, digits as text ("10" < "2"), a space, dot-folders,
// non-ASCII and undecodable UTF-8 (Python sorts byte 0xFF as U+DCFF,
// before U+E000), and several extension spellings and non-images.
void build_tricky_tree(const TempTree& t) {
  for (const auto& f :
       {"a/x.jpg",
        "a/X.JPG",
        "a/y.JpEg",
        "a/.dot.png",
        "a/notes.txt",
        "a/img.jpg.txt",
        "a/jpg",
        "a/noext",
        "a/b/y.png",
        "a/b/d/w.jpeg",
        "a/b-c/z.tif",
        "a/b.c/z.TIFF",
        "a/b0/v.PNG",
        "a/B/u.bmp",
        "a/.hidden/h.webp",
        "a/dir.jpg/in.ppm",
        "a/a b/s.pgm",
        "a-b/1.jpg",
        "a.b/1.jpg",
        "a b/2.jpg",
        "A/3.webp",
        "10/4.tiff",
        "2/5.tif",
        ".dotclass/6.ppm",
        "shared/s.pgm",
        "shared/deep/t.bmp",
        "file_at_root.jpg",
        "\xc3\xbcn\xc3\xaf"
        "c\xc3\xb6"
        "de/7.jpg",
        "\xff/8.jpg",
        "\xee\x80\x80/9.jpg",
        "\xef\xbf\xbd/10.jpg",
        "mixed/\xff.jpg",
        "mixed/\xee\x80\x80.jpg",
        "mixed/k.jpg",
        "mixed/\xc4\xb0.JPG",
        "mixed/kelvin.JP\xe2\x84\xaa"}) {
    t.file(f);
  }
  t.symlink("../shared", "a/link"); // symlinked subfolder
  t.symlink("shared", "classlink"); // symlinked class
  t.symlink("x.jpg", "a/filelink.png"); // symlink to a file
  t.symlink("nowhere.jpg", "a/broken.jpg"); // broken: still a "file"
  t.symlink("nowhere", "brokenclass"); // broken: not a class
  t.symlink("file_at_root.jpg", "rootfile"); // not a class
  t.fifo("a/pipe.png"); // not a regular file
  // A symbolic link cycle, walked until the system refuses the path.
  t.file("cycle/c.jpg");
  t.symlink("..", "cycle/sub/up");
}

TEST(ImageFolder, TrickyTreeMatchesTorchvision) {
  TempTree t("tricky");
  build_tricky_tree(t);
  LIST_WITH_TORCHVISION(python, {{t.dir(), ""}});
  ASSERT_NE(python[0].lines, std::vector<std::string>{"error"})
      << python[0].error;
  EXPECT_EQ(lamp_lines(t.dir()), python[0].lines);
  // The cycle really was walked deep, as Python walks it.
  size_t cycle_samples = 0;
  for (const auto& line : python[0].lines) {
    cycle_samples += line.find("/cycle/") != std::string::npos;
  }
  EXPECT_GT(cycle_samples, 10u);
}

TEST(ImageFolder, RootSpellingsMatchTorchvision) {
  TempTree t("spellings");
  t.file("b/1.png");
  t.file("a/sub/2.jpg");
  const auto base = t.dir().substr(t.dir().rfind('/') + 1);
  const std::vector<std::string> roots{
      t.dir() + "/", t.dir() + "//", t.dir() + "/./", t.dir() + "/../" + base};
  std::vector<std::pair<std::string, std::string>> cases;
  for (const auto& root : roots) {
    cases.emplace_back(root, "");
  }
  LIST_WITH_TORCHVISION(python, cases);
  for (size_t i = 0; i < roots.size(); ++i) {
    SCOPED_TRACE(roots[i]);
    EXPECT_EQ(lamp_lines(roots[i]), python[i].lines);
  }
}

// Sets $HOME for the scope of a test.
class ScopedHome {
 public:
  explicit ScopedHome(const std::string& home) {
    if (const char* old = std::getenv("HOME")) {
      saved_ = old;
    }
    setenv("HOME", home.c_str(), 1);
  }
  ~ScopedHome() {
    if (saved_) {
      setenv("HOME", saved_->c_str(), 1);
    } else {
      unsetenv("HOME");
    }
  }
  ScopedHome(const ScopedHome&) = delete;
  ScopedHome& operator=(const ScopedHome&) = delete;

 private:
  std::optional<std::string> saved_;
};

TEST(ImageFolder, ExpandsUserLikeTorchvision) {
  TempTree t("home");
  t.file("data/cat/1.jpg");
  ScopedHome home(t.dir() + "/"); // the trailing '/' is stripped
  const auto lamp = lamp_lines("~/data");
  ASSERT_FALSE(lamp.empty());
  EXPECT_EQ(lamp[0], "root\t" + t.dir() + "/data");
  LIST_WITH_TORCHVISION(python, {{"~/data", ""}});
  EXPECT_EQ(lamp, python[0].lines);
}

TEST(ImageFolder, OptionsMatchTorchvision) {
  TempTree t("options");
  t.file("a/keep.txt");
  t.file("a/drop.TXT");
  t.file("a/x.jpg");
  t.file("b/keep_me.jpg");
  t.file("b/unit.\xe2\x84\xaa"); // Kelvin sign: lower-cases to "k"
  t.file("b/unit.K");
  t.file("c/keep.dat");
  LIST_WITH_TORCHVISION(
      python,
      {{t.dir(), "--extensions=.txt,.k,.dat"},
       {t.dir(), "--extensions=.txt,.k,.DAT --allow-empty"},
       {t.dir(), "--valid-substring=keep"}});
  // Custom extensions (torchvision's DatasetFolder).
  ASSERT_NE(python[0].lines, std::vector<std::string>{"error"})
      << python[0].error;
  EXPECT_EQ(
      lamp_lines(
          t.dir(), ImageFolderOptions().extensions({".txt", ".k", ".dat"})),
      python[0].lines);
  // An upper-case extension never matches, as in Python: "c" is empty.
  EXPECT_EQ(
      lamp_lines(
          t.dir(),
          ImageFolderOptions()
              .extensions({".txt", ".k", ".DAT"})
              .allow_empty(true)),
      python[1].lines);
  // is_valid_file replaces the extensions.
  const auto keep = ImageFolderOptions().is_valid_file(
      [](const std::string& path) { return path.find("keep") != path.npos; });
  EXPECT_EQ(lamp_lines(t.dir(), keep), python[2].lines);
}

TEST(ImageFolder, EmptyClassesLikeTorchvision) {
  TempTree t("empty");
  t.file("full/x.jpg");
  t.file("b_empty/notes.txt");
  t.folder("a_empty");
  t.folder("c_empty/deeper");
  LIST_WITH_TORCHVISION(
      python,
      {{t.dir(), ""}, {t.dir(), "--allow-empty"}, {t.dir(), "--extensions="}});
  EXPECT_EQ(python[0].lines, std::vector<std::string>{"error"});
  EXPECT_EQ(
      python[0].error,
      "Found no valid file for the classes a_empty, b_empty, c_empty. "
      "Supported extensions are: .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, "
      ".tiff, .webp");
  expect_error([&] { ImageFolder folder(t.dir()); }, python[0].error);
  expect_error(
      [&] { ImageFolder folder(t.dir()); },
      "ImageFolderOptions().allow_empty(true)");
  // Kept as classes without samples.
  const auto allow = ImageFolderOptions().allow_empty(true);
  EXPECT_EQ(lamp_lines(t.dir(), allow), python[1].lines);
  const ImageFolder folder(t.dir(), allow);
  EXPECT_EQ(
      folder.classes(),
      (std::vector<std::string>{"a_empty", "b_empty", "c_empty", "full"}));
  EXPECT_EQ(folder.size(), 1u);
  EXPECT_EQ(folder[0].target, 3);
  // Without extensions, no file is valid (Python's endswith(())).
  EXPECT_EQ(python[2].lines, std::vector<std::string>{"error"});
  expect_error(
      [&] { ImageFolder(t.dir(), ImageFolderOptions().extensions({})); },
      python[2].error);
}

TEST(ImageFolder, RootErrorsLikeTorchvision) {
  TempTree t("errors");
  t.file("only_files/x.jpg");
  t.file("only_files/y.png");
  t.symlink("loop", "looping/loop"); // stat: too many symbolic links
  t.file("looping/ok/x.jpg");
  const std::vector<std::string> roots{
      t.path("missing"),
      t.path("only_files/x.jpg"),
      t.path("only_files"),
      t.path("looping"),
      ""};
  std::vector<std::pair<std::string, std::string>> cases;
  for (const auto& root : roots) {
    cases.emplace_back(root, "");
  }
  LIST_WITH_TORCHVISION(python, cases);
  for (size_t i = 0; i < roots.size(); ++i) {
    SCOPED_TRACE(roots[i]);
    EXPECT_EQ(python[i].lines, std::vector<std::string>{"error"});
    EXPECT_EQ(lamp_lines(roots[i]), std::vector<std::string>{"error"});
  }
  EXPECT_EQ(
      python[2].error,
      "Couldn't find any class folder in " + t.path("only_files") + ".");
  expect_error(
      [&] { ImageFolder folder(t.path("only_files")); }, python[2].error);
}

// --- Without Python ----------------------------------------------------------

TEST(ImageFolder, SortsAsPython) {
  TempTree t("sorts");
  for (const auto& f :
       {"a/b/1.jpg",
        "a/b/d/12.jpg",
        "a/b-c/2.jpg",
        "a/b0/3.jpg",
        "a/4.jpg",
        "a/B/5.jpg",
        "a-b/6.jpg",
        "10/7.jpg",
        "2/8.jpg",
        ".d/9.jpg",
        "\xff/10.jpg",
        "\xee\x80\x80/11.jpg"}) {
    t.file(f);
  }
  const ImageFolder folder(t.dir() + "/");
  EXPECT_EQ(folder.root(), t.dir() + "/");
  EXPECT_EQ(
      folder.classes(),
      (std::vector<std::string>{
          ".d", "10", "2", "a", "a-b", "\xff", "\xee\x80\x80"}));
  EXPECT_EQ(folder.class_to_idx().at("a"), 3);
  std::vector<std::string> paths;
  for (const auto& sample : folder.samples()) {
    paths.push_back(sample.path.substr(t.dir().size() + 1));
  }
  EXPECT_EQ(
      paths,
      (std::vector<std::string>{
          ".d/9.jpg",
          "10/7.jpg",
          "2/8.jpg",
          "a/4.jpg",
          "a/B/5.jpg", // upper case first
          "a/b/1.jpg",
          "a/b-c/2.jpg", // '-' < '/': before a/b's subfolders
          "a/b/d/12.jpg",
          "a/b0/3.jpg", // '/' < '0'
          "a-b/6.jpg",
          "\xff/10.jpg",
          "\xee\x80\x80/11.jpg"}));
}

TEST(ImageFolder, Errors) {
  TempTree t("lamp_errors");
  t.file("files/x.jpg");
  t.folder("empty/a");
  expect_error(
      [&] { ImageFolder folder(t.path("missing")); }, "does not exist");
  expect_error(
      [&] { ImageFolder folder(t.path("files/x.jpg")); }, "is not a folder");
  expect_error(
      [&] { ImageFolder folder(t.path("files")); },
      "Couldn't find any class folder in " + t.path("files") + ".");
  expect_error(
      [&] { ImageFolder folder(t.path("empty")); },
      "Found no valid file for the classes a. Supported extensions are: "
      ".jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp");
  const ImageFolder folder(
      t.path("empty"), ImageFolderOptions().allow_empty(true));
  EXPECT_EQ(folder.size(), 0u);
  try {
    (void)folder[0];
    ADD_FAILURE() << "no error";
  } catch (const c10::IndexError& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find("out of range"),
        std::string::npos);
  }
}

TEST(ImageFolder, ImageExtensionsAreTorchvisions) {
  EXPECT_EQ(
      lamp::data::image_extensions(),
      (std::vector<std::string>{
          ".jpg",
          ".jpeg",
          ".png",
          ".ppm",
          ".bmp",
          ".pgm",
          ".tif",
          ".tiff",
          ".webp"}));
  EXPECT_EQ(ImageFolderOptions().extensions(), lamp::data::image_extensions());
  EXPECT_FALSE(ImageFolderOptions().allow_empty());
  EXPECT_FALSE(ImageFolderOptions().is_valid_file());
}

} // namespace

} // namespace image_folder_test
