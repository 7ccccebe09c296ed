"""Says what a script sees of its process (tests/oracle_server_test.cpp):
its arguments, folder, environment and name, then does what they ask."""

import os
import signal
import sys

print("argv", repr(sys.argv[1:]))
print("cwd", os.getcwd())
print("env", os.environ.get("LAMP_ORACLE_PROBE"))
print("name", __name__)
print("path0", sys.path[0])
print("to stderr", file=sys.stderr)
sys.stdout.flush()
if sys.argv[1:2] == ["exit"]:
    sys.exit(int(sys.argv[2]))
if sys.argv[1:2] == ["raise"]:
    raise ValueError("asked to")
if sys.argv[1:2] == ["die"]:
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1:2] == ["big"]:
    sys.stdout.write("x" * (4 << 20) + "\n")
