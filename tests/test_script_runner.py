"""The fork server's bookkeeping of its runs (tests/script_runner.py), without forking anything."""

import io
import types

import script_runner


def test_a_reused_pid_does_not_take_an_earlier_runs_exit():
    """Linux reuses pids (pid_max 32768 on these machines): a run that gets the pid of one that ended
    earlier in the same server must not read that one's exit status as its own (a sweep test's driver
    once read as ended at once, and the test failed)."""
    server = object.__new__(script_runner.ForkServer)  # its state alone: no server process
    server.proc, server.ended = types.SimpleNamespace(stdin=io.BytesIO()), {}
    messages = [{"started": 4321}, {"pid": 4321, "status": 1}]
    server._message = lambda timeout: messages.pop(0) if messages else None
    earlier = server.start(["earlier.py"], {}, "out", "err")
    assert earlier.wait(1) == 1

    messages.append({"started": 4321})  # the same pid again, for the next run
    later = server.start(["later.py"], {}, "out", "err")
    assert later.pid == 4321 and later.poll() is None
    messages.append({"pid": 4321, "status": 0})
    assert later.wait(1) == 0 and earlier.returncode == 1
