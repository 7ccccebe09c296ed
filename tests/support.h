#pragma once

// Helpers shared by lamp's tests.

#include <lamp/cuda_graph.h>

#include <c10/util/Exception.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dist/launchers.h"
#include "oracle_client.h"

// Set by tests/CMakeLists.txt: the python whose torch is lamp's LibTorch (""
// when there is none) and the folder of the oracle scripts.
#ifndef LAMP_TEST_PYTHON
#define LAMP_TEST_PYTHON ""
#endif
#ifndef LAMP_TEST_SOURCE_DIR
#define LAMP_TEST_SOURCE_DIR "."
#endif

namespace lamp::test {

inline bool have_python_oracle() {
  return std::string(LAMP_TEST_PYTHON).size() > 0;
}

/// Runs `python tests/<script> <args>` with the Python torch that matches
/// lamp's LibTorch and returns its standard output. Fails the test (via
/// exception) when the script fails. On the oracle server when CTest runs
/// one (see Note [Python oracle server]).
inline std::string run_python_oracle(
    const std::string& script,
    const std::string& args) {
  const std::string path = std::string(LAMP_TEST_SOURCE_DIR) + "/" + script;
  if (auto run = run_on_oracle_server(path, args)) {
    if (run->status != 0) {
      throw std::runtime_error(
          "oracle failed (status " + std::to_string(run->status) +
          ", on the oracle server): " + path + " " + args);
    }
    return std::move(run->out);
  }
  const std::string command =
      std::string("\"") + LAMP_TEST_PYTHON + "\" \"" + path + "\" " + args;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(
      popen(command.c_str(), "r"), pclose);
  if (!pipe) {
    throw std::runtime_error("cannot start: " + command);
  }
  std::string out;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe.get())) > 0) {
    out.append(buffer.data(), n);
  }
  const int status = pclose(pipe.release());
  if (status != 0) {
    throw std::runtime_error(
        "oracle failed (status " + std::to_string(status) + "): " + command);
  }
  return out;
}

/// Whether the oracle python can `import module`. A yes is remembered in
/// the temporary folder (a file named after the python and the module), so
/// that the many test processes of a run start that python once, not once
/// each (importing torchvision takes seconds); a no is asked again.
inline bool python_can_import(const std::string& module) {
  if (!have_python_oracle()) {
    return false;
  }
  const std::string python = LAMP_TEST_PYTHON;
  const std::string memo = testing::TempDir() + "lamp_python_imports_" +
      std::to_string(std::hash<std::string>{}(python + " " + module));
  if (std::ifstream(memo).good()) {
    return true;
  }
  const std::string command = std::string("\"") + python + "\" -c \"import " +
      module + "\" > /dev/null 2>&1";
  if (std::system(command.c_str()) != 0) {
    return false;
  }
  std::ofstream(memo) << python << " imports " << module << "\n";
  return true;
}

/// Splits `text` into lines of whitespace-separated words.
inline std::vector<std::vector<std::string>> split_lines(
    const std::string& text) {
  std::vector<std::vector<std::string>> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<std::string> fields;
    std::string word;
    while (words >> word) {
      fields.push_back(word);
    }
    if (!fields.empty()) {
      lines.push_back(std::move(fields));
    }
  }
  return lines;
}

/// Runs a Python oracle that prints, for each of `cases` (its arguments),
/// a line "case NAME" and then lines "KEY WORD...": returns each case's
/// {KEY: its words joined by spaces} (the oracles' bits, compared with
/// hex_bits' strings).
inline std::map<std::string, std::map<std::string, std::string>> oracle_cases(
    const std::string& script,
    const std::vector<std::string>& cases) {
  std::string args;
  for (const auto& c : cases) {
    args += " " + c;
  }
  std::map<std::string, std::map<std::string, std::string>> out;
  std::string current;
  for (const auto& line : split_lines(run_python_oracle(script, args))) {
    if (line.at(0) == "case") {
      current = line.at(1);
      continue;
    }
    std::string words;
    for (size_t i = 1; i < line.size(); ++i) {
      words += (i == 1 ? "" : " ") + line[i];
    }
    out[current][line.at(0)] = words;
  }
  return out;
}

/// The bits of each element of `t` (4- or 2-byte elements) as hex words
/// separated by spaces, as the Python oracles print them: equal strings
/// are bitwise-equal tensors.
inline std::string hex_bits(const at::Tensor& t) {
  const auto c = t.detach().contiguous().cpu();
  const bool wide = c.element_size() == 4;
  const auto bits = c.view(wide ? at::kInt : at::kShort).flatten();
  std::string out;
  char word[16];
  for (int64_t i = 0; i < bits.numel(); ++i) {
    if (wide) {
      std::snprintf(
          word,
          sizeof word,
          "%s%08x",
          i == 0 ? "" : " ",
          static_cast<uint32_t>(bits[i].item<int32_t>()));
    } else {
      std::snprintf(
          word,
          sizeof word,
          "%s%04x",
          i == 0 ? "" : " ",
          static_cast<uint16_t>(bits[i].item<int16_t>()));
    }
    out += word;
  }
  return out;
}

/// Expects `f` to throw a c10::Error whose message contains `message`.
inline void expect_error(
    const std::function<void()>& f,
    const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << message;
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find(message),
        std::string::npos)
        << e.what_without_backtrace();
  }
}

/// Expects `f` to throw an `Error` (a c10 error class, e.g.
/// c10::DistBackendError) whose message contains `message`.
template <typename Error>
void expect_error_of(
    const std::function<void()>& f,
    const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << message;
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find(message),
        std::string::npos)
        << e.what_without_backtrace();
  } catch (const c10::Error& e) {
    ADD_FAILURE() << "an error of another type: " << e.what_without_backtrace();
  }
}

/// `jpeg` with its first Huffman table made impossible (16 code counts of
/// 255 in a segment of the old length): libjpeg reads "Bogus Huffman table
/// definition", a decoder that keeps state across files may then fail the
/// next good file too.
inline std::vector<uint8_t> with_bogus_huffman_table(
    std::vector<uint8_t> jpeg) {
  for (size_t i = 2; i + 21 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC4) {
      // FF C4, a 2-byte length, the table's class and id, 16 counts.
      for (size_t k = 0; k < 16; ++k) {
        jpeg[i + 5 + k] = 0xFF;
      }
      return jpeg;
    }
  }
  ADD_FAILURE() << "no DHT marker in the JPEG";
  return jpeg;
}

/// Writes `bytes` to `path`.
inline void write_bytes(
    const std::string& path,
    const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) { // fwrite's buffer may not be null, even for 0 bytes
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  }
  std::fclose(f);
}

/// The test folders this process made, removed when its tests end.
inline std::vector<std::string>& folders_to_remove() {
  static std::vector<std::string> folders;
  return folders;
}

/// Removes folders_to_remove() after the last test, unless a test failed
/// (its files are then kept to be looked at) or LAMP_KEEP_TEST_FILES=1.
/// NOTE: the kill tests alone write ~100 MB a run, and a CI machine's disk
/// is not ours to fill (a CI run ran out of it; docs/building.md, "Disk").
class RemoveTestFolders : public testing::Environment {
 public:
  void TearDown() override {
    const char* keep = std::getenv("LAMP_KEEP_TEST_FILES");
    if ((keep != nullptr && std::string(keep) == "1") ||
        !testing::UnitTest::GetInstance()->Passed()) {
      return;
    }
    for (const auto& dir : folders_to_remove()) {
      EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0) << dir;
    }
  }
};
inline testing::Environment* const kRemoveTestFolders =
    testing::AddGlobalTestEnvironment(new RemoveTestFolders);

/// Has `dir` removed when this process's tests end (RemoveTestFolders).
inline void remove_when_tests_end(const std::string& dir) {
  folders_to_remove().push_back(dir);
}

/// A fresh, empty folder `<temp dir>/lamp_<name>_<pid>`: one per process,
/// as ctest runs tests in parallel; removed when the tests end.
inline std::string fresh_dir(const std::string& name) {
  const auto dir =
      testing::TempDir() + "lamp_" + name + "_" + std::to_string(getpid());
  EXPECT_EQ(
      std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()),
      0);
  remove_when_tests_end(dir);
  return dir;
}

/// The names of the entries of `dir` (without "." and "..").
inline std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const auto* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") {
        names.push_back(name);
      }
    }
    closedir(d);
  }
  return names;
}

/// The launcher variables lamp::dist reads (torchrun, Slurm, Open MPI,
/// PMI), which `ScopedEnv` clears.
inline const std::vector<std::string>& launcher_variables() {
  return lamp::dist::detail::launcher_variables();
}

/// Clears the launcher variables, sets `values` for the scope of one test
/// (through setenv) and restores the environment afterwards.
class ScopedEnv {
 public:
  using Values = std::map<std::string, std::string>;
  explicit ScopedEnv(const Values& values = {}) {
    for (const auto& name : launcher_variables()) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(name.c_str());
    }
    for (const auto& [name, value] : values) {
      if (!saved_.count(name)) {
        const char* old = std::getenv(name.c_str());
        saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      }
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

/// A TCP port on the loopback interface that nobody listens on right now.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

/// Runs a training step `steps` times on `inputs`: through
/// lamp::GraphedStep (warm-up, capture, replays) when `graphed`, expecting
/// it captured, else eagerly. For tests that compare the two.
inline void run_steps(
    bool graphed,
    const lamp::GraphedStep::Function& step,
    const std::vector<torch::Tensor>& inputs,
    torch::optim::Optimizer& optimizer,
    int steps = 6) {
  if (!graphed) {
    for (int i = 0; i < steps; ++i) {
      step(inputs);
    }
    return;
  }
  lamp::GraphedStep g(step, inputs, {&optimizer});
  for (int i = 0; i < steps; ++i) {
    g(inputs);
  }
  EXPECT_TRUE(g.is_captured());
}

/// Fixture of single-GPU tests: skipped (not passed) without CUDA. Name
/// suites that use it `...Gpu` so that CTest labels them `gpu`.
class GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "needs a CUDA device; none found";
    }
  }
};

} // namespace lamp::test

/// In a test body or SetUp(): skip (reported as skipped by CTest) when no
/// CUDA device is present.
#define LAMP_SKIP_WITHOUT_CUDA()                         \
  do {                                                   \
    if (!torch::cuda::is_available()) {                  \
      GTEST_SKIP() << "needs a CUDA device; none found"; \
    }                                                    \
  } while (0)

/// Skip when there is no Python torch of lamp's LibTorch version to compare
/// against (configure prints why).
#define LAMP_SKIP_WITHOUT_PYTHON_ORACLE()                           \
  do {                                                              \
    if (!lamp::test::have_python_oracle()) {                        \
      GTEST_SKIP() << "needs a python with torch " << TORCH_VERSION \
                   << " (none was found at configure time)";        \
    }                                                               \
  } while (0)
