#!/usr/bin/env python3
"""recall chat on a real terminal (a pty) against a real `recall serve` (stories260K):
Ctrl-C stops a reply, which the server keeps marked interrupted (/history shows it); the
line history is saved; Ctrl-C at the prompt quits. Then `recall serve` restarts a worker
killed under it, and a chat turn is served after.

usage: run.py RECALL_BINARY SHARED_DIR   (skips, exit 0 with a message, without the model)
"""
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time

RECALL, SHARED = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SHARED, "models/stories260K/stories260K.bin")
TOKENIZER = os.path.join(SHARED, "models/stories260K/tok512.bin")


def fail(message, *logs):
    print("FAIL:", message)
    for log in logs:
        print("----\n" + log)
    sys.exit(1)


def read_until(fd, buf, want, seconds):
    """Reads the pty into buf until `want` appears in it (or the time is up)."""
    return read_while(fd, buf, lambda b: want in b, seconds)


def read_while(fd, buf, pred, seconds):
    """Reads the pty into buf until pred(buf[0]) holds (or the time is up)."""
    end = time.time() + seconds
    while time.time() < end and not pred(buf[0]):
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                buf[0] += os.read(fd, 65536).decode(errors="replace")
            except OSError:
                break
    return pred(buf[0])


def ask_again(fd, buf):
    """At the prompt, starts a new session (/new: a session of 400-token replies fills the
    model's 512-token context within two tries) with a message, and waits until its reply
    starts streaming."""
    read_while(fd, buf, lambda b: b.endswith("\n> "), 10)
    os.write(fd, b"/new\r")
    read_while(fd, buf, lambda b: b.endswith("\n> "), 10)
    mark = len(buf[0])
    os.write(fd, b"Once upon a time\r")
    read_while(fd, buf, lambda b: len(b) > mark + len("Once upon a time") + 4, 10)


def main():
    if not os.path.exists(MODEL):
        print("SKIP: shared data missing:", MODEL)
        return 0
    home = tempfile.mkdtemp(prefix="recall_chat_tty_")
    data = os.path.join(home, "data")
    port_file = os.path.join(home, "ports")
    serve_log = open(os.path.join(home, "serve.log"), "w+")
    serve = subprocess.Popen(
        [RECALL, "serve", "-m", MODEL, "--tokenizer", TOKENIZER, "--data-dir", data,
         "--listen", "127.0.0.1:0", "--http-listen", "off", "--port-file", port_file],
        stdout=serve_log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if os.path.exists(port_file):
                break
            time.sleep(0.05)
        else:
            serve_log.seek(0)
            fail("recall serve did not start", serve_log.read())
        grpc_port = open(port_file).read().split()[0].split("=")[1]
        server = "127.0.0.1:" + grpc_port

        # A chat on a terminal.
        pid, fd = pty.fork()
        if pid == 0:
            os.environ["HOME"] = home
            os.execv(RECALL, [RECALL, "chat", "--server", server, "-n", "400"])
        buf = [""]
        read_until(fd, buf, "> ", 10)
        os.write(fd, b"Once upon a time\r")
        if not read_until(fd, buf, "[session", 20):
            fail("no session was started", buf[0])
        # Ctrl-C while the reply streams; a reply that ended first (an early end of text) is
        # followed by another message, a few times.
        for attempt in range(8):
            mark = len(buf[0])
            read_while(fd, buf, lambda b: b.endswith("\n> "), 0.05)  # some of the reply streams
            if buf[0].endswith("\n> "):  # it ended already (Ctrl-C now would quit)
                ask_again(fd, buf)
                continue
            os.write(fd, b"\x03")  # Ctrl-C: stop the reply
            stopped = lambda b: "]" in b[b.rfind("[stopped"):] if "[stopped" in b[mark:] else False
            if not read_while(fd, buf, stopped, 10):
                ask_again(fd, buf)
                continue
            # A loaded machine can finish the whole reply before the cancel reaches the
            # server: chat then says it was kept whole, and the test tries again.
            if "marked interrupted]" in buf[0][buf[0].rfind("[stopped"):]:
                break
            ask_again(fd, buf)
        else:
            fail("Ctrl-C did not stop a reply", buf[0])
        os.write(fd, b"/history\r")
        if not read_until(fd, buf, "(interrupted", 20):
            fail("/history does not show the stopped reply as interrupted", buf[0])
        read_until(fd, buf, "\n> ", 5)
        os.write(fd, b"\x03")  # Ctrl-C at the prompt: quit
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT) and \
                not (os.WIFEXITED(status)):
            fail("Ctrl-C at the prompt did not end the chat (wait status %d)" % status, buf[0])
        # libedit's file escapes spaces as \040.
        history = open(os.path.join(home, ".recall_history")).read().replace("\\040", " ")
        if "Once upon a time" not in history or "/history" not in history:
            fail("the line history was not saved", history)

        # The worker dies under recall serve: it is restarted, and a turn is served.
        serve_log.seek(0)
        worker_pids = subprocess.run(["pgrep", "-P", str(serve.pid), "-f", "recall-worker"],
                                     capture_output=True, text=True).stdout.split()
        if len(worker_pids) != 1:
            fail("cannot find recall serve's worker: %r" % worker_pids, serve_log.read())
        os.kill(int(worker_pids[0]), signal.SIGKILL)
        for _ in range(600):
            serve_log.seek(0)
            if "worker back on port" in serve_log.read():
                break
            time.sleep(0.05)
        else:
            serve_log.seek(0)
            fail("recall serve did not restart its worker", serve_log.read())
        # (The coordinator may still count the worker down for a heartbeat or two: a turn
        # then fails UNAVAILABLE, retryable; retry for a while, as a client would.)
        for _ in range(40):
            turn = subprocess.run([RECALL, "chat", "--server", server, "-n", "8"],
                                  input="Lily went\n", capture_output=True, text=True,
                                  timeout=120)
            if turn.returncode == 0 and "assistant:" in turn.stdout:
                break
            time.sleep(0.25)
        if turn.returncode != 0 or "assistant:" not in turn.stdout:
            serve_log.seek(0)
            fail("no turn after the restart: " + turn.stdout + turn.stderr, serve_log.read())
        print("PASS: Ctrl-C stopped a reply, kept as interrupted; history saved; worker restarted")
        return 0
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()


if __name__ == "__main__":
    sys.exit(main())
