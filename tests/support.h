#pragma once

// Helpers shared by lamp's tests.

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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
/// exception) when the script fails.
inline std::string run_python_oracle(
    const std::string& script,
    const std::string& args) {
  const std::string command = std::string("\"") + LAMP_TEST_PYTHON + "\" \"" +
      LAMP_TEST_SOURCE_DIR + "/" + script + "\" " + args;
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

/// Whether the oracle python can `import module`.
inline bool python_can_import(const std::string& module) {
  if (!have_python_oracle()) {
    return false;
  }
  const std::string command = std::string("\"") + LAMP_TEST_PYTHON +
      "\" -c \"import " + module + "\" > /dev/null 2>&1";
  return std::system(command.c_str()) == 0;
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
