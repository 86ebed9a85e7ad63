"""Stops one thread of a running process with ptrace while its other threads
run on: PTRACE_SEIZE, then PTRACE_INTERRUPT (a stop only that thread is in),
later PTRACE_DETACH. The tests use it to stall the agent's window loop (its
main thread) while its HTTP threads keep serving.

The tracer is a child process of its own (this file run as a script): the
ptrace link ends with it, so a failing test, or the traced process being
killed meanwhile (systemd's watchdog does that), leaves nothing stopped or
unreaped behind.
"""
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000  # __WALL: wait for a thread that is not a child


class StoppedThread:
    """with StoppedThread(tid) as t: the thread is stopped (its state in /proc is 't') until the block ends
    or t.resume(). Raises if it cannot be stopped."""

    def __init__(self, tid, timeout=10):
        self.tid = tid
        self.outcome = None
        self.tracer = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(tid)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.tracer.stdout], [], [], timeout)
        line = self.tracer.stdout.readline().strip() if ready else ""
        if line != "stopped":
            self.tracer.kill()
            _, err = self.tracer.communicate()
            raise AssertionError(f"could not stop thread {tid} with ptrace: {line or 'no answer'} {err}")
        self.stopped_at = time.monotonic()

    def state(self):
        """The thread's state letter in /proc (t: stopped by its tracer)."""
        with open(f"/proc/{self.tid}/task/{self.tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def resume(self, timeout=10):
        """Lets the thread go on; returns what the tracer saw last ("resumed", or "exited" if the process died)."""
        if self.tracer.stdin.closed:
            return self.outcome
        self.tracer.stdin.close()
        try:
            self.tracer.wait(timeout)
        except subprocess.TimeoutExpired:
            self.tracer.kill()
            self.tracer.wait()
        out, err = self.tracer.stdout.read(), self.tracer.stderr.read()
        self.tracer.stdout.close()
        self.tracer.stderr.close()
        self.outcome = out.strip().splitlines()[-1] if out.strip() else f"tracer failed: {err}"
        return self.outcome

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.resume()


def _ptrace(libc, request, tid, data=0):
    if libc.ptrace(request, tid, None, ctypes.c_void_p(data)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request}, {tid}): {os.strerror(err)}")


def _trace(tid):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    _ptrace(libc, PTRACE_SEIZE, tid)
    _ptrace(libc, PTRACE_INTERRUPT, tid)
    pending = 0  # a signal the thread took while stopped: delivered at the detach
    while True:
        _, status = os.waitpid(tid, WALL)
        if not os.WIFSTOPPED(status):
            print("exited", flush=True)
            return
        if status >> 16 == PTRACE_EVENT_STOP:
            break
        # A signal-delivery stop that came first: keep the signal, then the interrupt's stop follows.
        pending = os.WSTOPSIG(status)
        _ptrace(libc, PTRACE_CONT, tid, 0)
    print("stopped", flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        if readable and not os.read(sys.stdin.fileno(), 1):
            break  # stdin closed: resume
        pid, status = os.waitpid(tid, WALL | os.WNOHANG)
        if pid and not os.WIFSTOPPED(status):
            print("exited", flush=True)  # killed while stopped; reaped here, so its parent sees it
            return
        if pid and status >> 16 != PTRACE_EVENT_STOP:
            pending = os.WSTOPSIG(status)  # stays stopped: a signal-delivery stop
    _ptrace(libc, PTRACE_DETACH, tid, pending)
    print("resumed", flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _trace(int(sys.argv[1]))
