"""The privacy test's TLS workload: a server with the canary key and a client
that sends the canary plaintext, over and over, through Python's ssl module
(Debian's libssl/libcrypto.so.3, so the agent profiles real OpenSSL work).

    privacy_workload.py server KEY CERT READY_FILE   # writes its port to READY_FILE
    privacy_workload.py client PORT CANARY LOG        # a new handshake every 8 messages

The client writes the canary into LOG on purpose: the test's positive
control, so that its search is shown to find a canary that is there.
"""
import os
import socket
import ssl
import sys
import threading


def serve(key, cert, ready):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    # RSA key exchange is gone in TLS 1.3: the canary key signs every full handshake (no tickets: no resumption).
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0
    listener = socket.create_server(("127.0.0.1", 0))
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(listener.getsockname()[1]))
    os.rename(tmp, ready)

    def handle(conn):
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                while tls.recv(65536):
                    pass
        except (OSError, ssl.SSLError):
            pass

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def send(port, canary, log):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    message = (canary + "\n").encode() * 2048  # ~100 KB of canary per message
    with open(log, "w") as f:
        f.write(f"client sends {canary}\n")  # the positive control
    while True:
        with socket.create_connection(("127.0.0.1", int(port))) as raw, ctx.wrap_socket(raw) as tls:
            for _ in range(8):
                tls.sendall(message)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(*sys.argv[2:5])
    else:
        send(*sys.argv[2:5])
