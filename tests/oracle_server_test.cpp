// NOTE: helpers in namespace oracle_server_test (unity build).
//
// The Python oracle server runs a script as `python script args` would
// (see Note [Python oracle server]): same output, arguments, folder,
// environment and exit status.

#include <sys/wait.h>

#include "support.h"

namespace oracle_server_test {

const std::string kProbe =
    std::string(LAMP_TEST_SOURCE_DIR) + "/oracle_probe.py";

// `python probe args` started here, the way tests did before the server.
lamp::test::OracleRun run_directly(const std::string& args) {
  const std::string command = std::string("\"") + LAMP_TEST_PYTHON + "\" \"" +
      kProbe + "\" " + args + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  lamp::test::OracleRun run;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    run.out.append(buffer, n);
  }
  const int status = pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

lamp::test::OracleRun run_on_server(const std::string& args) {
  auto run = lamp::test::run_on_oracle_server(kProbe, args);
  if (!run) {
    throw std::runtime_error("the oracle server did not answer");
  }
  return *run;
}

class OracleServer : public testing::Test {
 protected:
  void SetUp() override {
    LAMP_SKIP_WITHOUT_PYTHON_ORACLE();
    if (std::getenv("LAMP_ORACLE_SOCKET") == nullptr) {
      GTEST_SKIP() << "no oracle server: CTest starts one (the python_oracle "
                      "fixture); run this test through ctest";
    }
  }
};

TEST_F(OracleServer, RunsAScriptAsPythonWould) {
  setenv("LAMP_ORACLE_PROBE", "probe value", 1);
  const std::string dir = lamp::test::fresh_dir("oracle_server_cwd");
  std::array<char, PATH_MAX> cwd{};
  ASSERT_NE(getcwd(cwd.data(), cwd.size()), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  for (const std::string args :
       {"", "a 'b c' \"d'e\" :: f\\ g", "exit 0", "exit 3", "raise"}) {
    SCOPED_TRACE(args);
    const auto server = run_on_server(args);
    const auto direct = run_directly(args);
    EXPECT_EQ(server.out, direct.out);
    EXPECT_EQ(server.status, direct.status);
    EXPECT_NE(server.out.find("name __main__"), std::string::npos);
  }
  EXPECT_EQ(run_on_server("exit 3").status, 3);
  EXPECT_EQ(run_on_server("raise").status, 1);
  const auto big = run_on_server("big");
  EXPECT_EQ(big.status, 0);
  EXPECT_GT(big.out.size(), size_t{4} << 20);
  ASSERT_EQ(chdir(cwd.data()), 0);
  unsetenv("LAMP_ORACLE_PROBE");
}

TEST_F(OracleServer, AScriptThatDiesIsAFailureAndTheServerGoesOn) {
  const auto died = run_on_server("die");
  EXPECT_EQ(died.status, -1);
  EXPECT_NE(died.out.find("argv ['die']"), std::string::npos);
  EXPECT_EQ(run_on_server("exit 0").status, 0);
  // And through the tests' helper: a clear error.
  try {
    lamp::test::run_python_oracle("oracle_probe.py", "exit 2");
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("status 2"), std::string::npos)
        << e.what();
  }
}

} // namespace oracle_server_test
