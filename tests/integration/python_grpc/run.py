#!/usr/bin/env python3
"""Python's grpcio (Debian's python3-grpcio, a client nobody here wrote) against a real
`recall serve` (stories260K): stubs generated from proto/ with Debian's protoc and
grpc_python_plugin (Debian's python3-grpc-tools bundles a protoc too old for proto3
`optional`), a session, two streamed turns, the stored transcript, a bad request's code and
message, and the session deleted.

usage: run.py RECALL_BINARY SOURCE_DIR SHARED_DIR   (skips without the model or grpcio)
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RECALL, SOURCE, SHARED = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = os.path.join(SHARED, "models/stories260K/stories260K.bin")
TOKENIZER = os.path.join(SHARED, "models/stories260K/tok512.bin")
SKIP = 77


def fail(message, log=""):
    print("FAIL:", message)
    if log:
        print("----\n" + log)
    sys.exit(1)


def main():
    if not os.path.exists(MODEL):
        print("SKIP: shared data missing:", MODEL)
        return SKIP
    try:
        import grpc  # noqa: F401
    except ImportError:
        print("SKIP: python3-grpcio is not installed (tools/install_deps.sh installs it)")
        return SKIP
    plugin = shutil.which("grpc_python_plugin")
    if plugin is None or shutil.which("protoc") is None:
        print("SKIP: protoc or grpc_python_plugin missing (protobuf-compiler-grpc)")
        return SKIP
    work = tempfile.mkdtemp(prefix="recall_python_grpc_")
    stubs = os.path.join(work, "stubs")
    os.makedirs(stubs)
    proto_dir = os.path.join(SOURCE, "proto")
    subprocess.run(["protoc", "-I" + proto_dir, "--python_out=" + stubs, "--grpc_out=" + stubs,
                    "--plugin=protoc-gen-grpc=" + plugin,
                    os.path.join(proto_dir, "recall/v1/chat.proto"),
                    os.path.join(proto_dir, "recall/v1/worker.proto")], check=True)
    sys.path.insert(0, stubs)
    import grpc
    from recall.v1 import chat_pb2, chat_pb2_grpc, worker_pb2

    port_file = os.path.join(work, "ports")
    log = open(os.path.join(work, "serve.log"), "w+")
    serve = subprocess.Popen(
        [RECALL, "serve", "-m", MODEL, "--tokenizer", TOKENIZER, "--data-dir",
         os.path.join(work, "data"), "--listen", "127.0.0.1:0", "--http-listen", "off",
         "--port-file", port_file], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if os.path.exists(port_file):
                break
            time.sleep(0.05)
        else:
            log.seek(0)
            fail("recall serve did not start", log.read())
        port = open(port_file).read().split()[0].split("=")[1]
        channel = grpc.insecure_channel("127.0.0.1:" + port)
        chat = chat_pb2_grpc.ChatStub(channel)

        session = chat.CreateSession(chat_pb2.CreateSessionRequest(system_prompt=b"Tell a story."),
                                     timeout=30)
        replies = []
        for message in ["Once upon a time", "What happened next?"]:
            text, done = "", None
            # (Text fields are bytes on the wire, so the server checks their UTF-8.)
            request = chat_pb2.ConverseRequest(session_id=session.session_id,
                                               message=message.encode())
            request.sampling.temperature = 0
            request.sampling.max_tokens = 24
            for event in chat.Converse(request, timeout=60):
                if event.HasField("tokens"):
                    text += event.tokens.text
                elif event.HasField("done"):
                    done = event.done
            if done is None or not text:
                fail("turn %r: no reply or no end (%r)" % (message, text))
            if done.usage.generated_tokens <= 0:
                fail("turn %r: generated_tokens %d" % (message, done.usage.generated_tokens))
            replies.append(text)
        if done.usage.cached_tokens <= 0:
            fail("the second turn reused no cached token")

        stored = chat.GetSession(chat_pb2.GetSessionRequest(session_id=session.session_id),
                                 timeout=30)
        roles = [m.role for m in stored.messages]
        if roles != ["system", "user", "assistant", "user", "assistant"]:
            fail("stored roles: %r" % roles)
        if [m.content.decode() for m in stored.messages if m.role == "assistant"] != replies:
            fail("the stored replies differ from the streamed ones")
        if any(m.state != worker_pb2.TURN_STATE_COMPLETE
               for m in stored.messages if m.role == "assistant"):
            fail("a stored reply is not complete")
        if stored.turns != 2 or stored.total_tokens <= 0:
            fail("turns %d, total_tokens %d" % (stored.turns, stored.total_tokens))

        # A bad request: INVALID_ARGUMENT naming the field.
        bad = chat_pb2.ConverseRequest(session_id=session.session_id, message=b"hi")
        bad.sampling.top_p = 2.0
        try:
            for _ in chat.Converse(bad, timeout=30):
                pass
            fail("top_p 2.0 was accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT or "top_p" not in e.details():
                fail("top_p 2.0: %s %r" % (e.code(), e.details()))

        chat.DeleteSession(chat_pb2.DeleteSessionRequest(session_id=session.session_id),
                           timeout=30)
        try:
            chat.GetSession(chat_pb2.GetSessionRequest(session_id=session.session_id), timeout=30)
            fail("the deleted session is still there")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                fail("GetSession of a deleted session: %s" % e.code())
        print("PASS: grpcio: session, two streamed turns (%d cached tokens), transcript, "
              "INVALID_ARGUMENT naming top_p, delete" % done.usage.cached_tokens)
        return 0
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
