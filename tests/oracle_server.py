"""A forking server for the tests' Python oracles.

Importing torch and torchvision takes 4-6 s of CPU on the 2-core CI machine,
and a test run starts an oracle script a few hundred times (twice over in CI:
the Release and the ASan stages). This server imports them once; each request
is run by a fork() of it, so a script starts in milliseconds and runs exactly
as `python SCRIPT ARGS` would: its own process, sys.argv, cwd, environment,
the client's stdout pipe and stderr, and the exit status sent back.

    oracle_server.py start SOCKET   start the server in the background, wait
                                    until it answers (or say why it cannot)
    oracle_server.py stop SOCKET    stop it

CTest starts and stops it as the `python_oracle` fixture; a test process finds
it through LAMP_ORACLE_SOCKET and falls back to starting Python itself when
there is none. See Note [Python oracle server] in tests/oracle_client.h for
the protocol.
"""

import array
import os
import runpy
import shlex
import signal
import socket
import struct
import sys
import time
import traceback

# NOTE: a server nobody stops (a killed ctest) goes away by itself.
IDLE_SECONDS = 900


def preload():
    """Imports what the oracle scripts import; what is missing is skipped
    (the script then fails as it would without the server)."""
    for name in ("numpy", "torch", "torch.nn.functional", "PIL.Image",
                 "torchvision", "torchvision.transforms",
                 "torchvision.transforms.functional"):
        try:
            __import__(name)
        except Exception:
            pass


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("the client went away")
        data += chunk
    return data


def read_request(conn):
    """One request: its fds (stdout, stderr) ride on the first bytes."""
    fds = array.array("i")
    msg, ancdata, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request carries exactly two fds")
    msg += recv_exact(conn, 4 - len(msg))
    (size,) = struct.unpack("!I", msg)
    fields = recv_exact(conn, size).decode().split("\0")
    cwd, script, args, env = fields[0], fields[1], fields[2], fields[3:]
    return list(fds), cwd, script, args, env


def run_script(conn, fds, cwd, script, args, env):
    """In the forked child: becomes `python script args`; never returns."""
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, *fds):
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(e.split("=", 1) for e in env if "=" in e)
        sys.argv = [script] + shlex.split(args)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as e:
            if e.code is None:
                status = 0
            elif isinstance(e.code, int):
                status = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                status = 1
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            # Close stdout first: the client reads it to its end, then the
            # status.
            os.close(1)
            conn.sendall(struct.pack("!i", status))
        finally:
            os._exit(0)


def serve(path):
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(IDLE_SECONDS)
    with open(path + ".pid", "w") as f:
        f.write(str(os.getpid()))
    # Children are reaped by the kernel; each reports its own status.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            break
        conn.settimeout(None)
        try:
            request = read_request(conn)
        except Exception:
            conn.close()
            continue
        fds = request[0]
        if os.fork() == 0:
            listener.close()
            run_script(conn, *request)
        for fd in fds:
            os.close(fd)
        conn.close()
    os.unlink(path)


def stop(path):
    try:
        with open(path + ".pid") as f:
            os.kill(int(f.read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for p in (path, path + ".pid"):
        if os.path.exists(p):
            os.unlink(p)


def start(path):
    stop(path)
    if os.fork() == 0:
        # The server: out of the caller's session, stdio to a log, so that
        # ctest does not wait for it.
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        log = os.open(path + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        try:
            serve(path)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            print("python oracle server on", path)
            return 0
        except OSError:
            time.sleep(0.2)
        finally:
            probe.close()
    # NOTE: not an error: the tests then start Python themselves (slower).
    print("python oracle server did not start (see", path + ".log);",
          "tests start Python themselves")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: oracle_server.py start|stop SOCKET")
    sys.exit(start(sys.argv[2]) if sys.argv[1] == "start"
             else stop(sys.argv[2]))
