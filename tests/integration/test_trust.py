#!/usr/bin/env python3
"""A kv-store as an independent, adversarial client sees it: a Python grpcio client built from
proto/kvstore.proto against real kv-store processes.

  * security: TLS with a CA made by openssl here; plaintext refused; no token, a wrong token
    refused (UNAUTHENTICATED); the right token works; another credential cannot use a session
    (PERMISSION_DENIED) nor see it in Stats; mutual TLS refuses a client without a certificate;
    the store's log has no full session id and no forged line from a client name;
  * liveness: 100 silent streams do not stop a new client's Health / OpenSession, and lose their
    slots after --first-message-ms; calls beyond --max-calls are refused at once
    (RESOURCE_EXHAUSTED);
  * input safety: NaN K/V and a huge top_k are INVALID_ARGUMENT with nothing stored; a cancelled
    PutKv leaves nothing and the retry stores everything.

  test_trust.py KV_STORE PROTO_FILE
Exits 77 (skipped) when grpcio / grpcio-tools or openssl are missing (deploy/setup.sh installs
them)."""
import os
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

try:
    import grpc
    from grpc_tools import protoc
except ImportError:
    print("skipped: grpcio / grpcio-tools not installed (deploy/setup.sh)")
    sys.exit(77)
if not shutil.which("openssl"):
    print("skipped: no openssl")
    sys.exit(77)

KVS, PROTO = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="ra-trust-")
FIRST_MESSAGE_MS = 1500
MAX_CALLS = 4
DIM = 8


def sh(*args):
    subprocess.run(args, check=True, cwd=TMP, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_pki():
    """A CA, a server certificate for 127.0.0.1 / localhost, and a client certificate."""
    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ra-test-ca",
       "-keyout", "ca.key", "-out", "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "extendedKeyUsage=clientAuth")):
        sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=ra-test-{name}", "-keyout", f"{name}.key",
           "-out", f"{name}.csr")
        with open(os.path.join(TMP, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        sh("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
           "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")


def read(name):
    with open(os.path.join(TMP, name), "rb") as f:
        return f.read()


def stubs():
    out = os.path.join(TMP, "py")
    os.makedirs(out)
    inc = os.path.dirname(os.path.abspath(PROTO))
    rc = protoc.main(["protoc", f"-I{inc}", f"--python_out={out}", f"--grpc_python_out={out}", os.path.abspath(PROTO)])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    import kvstore_pb2
    import kvstore_pb2_grpc
    return kvstore_pb2, kvstore_pb2_grpc


class Store:
    def __init__(self, name, *args):
        self.ready = os.path.join(TMP, f"{name}.addr")
        self.log_path = os.path.join(TMP, f"{name}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([KVS, "--listen", "127.0.0.1:0", "--ready-file", self.ready, "--threads", "1",
                                      "--memory-budget", "64M", *args], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(100):
            if os.path.exists(self.ready) and os.path.getsize(self.ready):
                self.addr = open(self.ready).read().strip()
                return
            time.sleep(0.1)
        raise RuntimeError(f"kv-store {name} did not start: " + open(self.log_path).read())

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(10)
        self.log.close()
        assert rc == 0, f"kv-store exited {rc}"
        return open(self.log_path).read()


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def expect(code, fn, what, detail=None):
    got, details = code_of(fn)
    assert got == code, f"{what}: {got} ({details}), want {code}"
    if detail:
        assert detail in details, f"{what}: '{details}' lacks '{detail}'"
    print(f"ok: {what}: {code.name}" + (f" ({details})" if details else ""))


def main():
    make_pki()
    pb, pbg = stubs()
    with open(os.path.join(TMP, "tokens"), "w") as f:
        f.write("# two tenants\ntoken-alpha-1234567890\n  token-beta-0987654321  \n")
    st = Store("tls", "--tls-cert", os.path.join(TMP, "server.pem"), "--tls-key", os.path.join(TMP, "server.key"),
               "--auth-token-file", os.path.join(TMP, "tokens"), "--first-message-ms", str(FIRST_MESSAGE_MS),
               "--max-calls", str(MAX_CALLS), "--max-waiting", "256")
    creds = grpc.ssl_channel_credentials(root_certificates=read("ca.pem"))
    tls = grpc.secure_channel(st.addr, creds)
    kv = pbg.KvStoreStub(tls)
    A = [("authorization", "Bearer token-alpha-1234567890")]
    B = [("authorization", "Bearer token-beta-0987654321")]

    # ---- security
    plain = pbg.KvStoreStub(grpc.insecure_channel(st.addr))
    expect(grpc.StatusCode.UNAVAILABLE, lambda: plain.Health(pb.HealthRequest(), timeout=3), "plaintext to a TLS store")
    expect(grpc.StatusCode.UNAUTHENTICATED, lambda: kv.Health(pb.HealthRequest(), timeout=5), "no token")
    expect(grpc.StatusCode.UNAUTHENTICATED,
           lambda: kv.Health(pb.HealthRequest(), timeout=5, metadata=[("authorization", "Bearer token-alpha-123456789")]),
           "a wrong token")
    expect(grpc.StatusCode.UNAUTHENTICATED,
           lambda: kv.Health(pb.HealthRequest(), timeout=5, metadata=[("authorization", "token-alpha-1234567890")]),
           "a token without Bearer")
    assert kv.Health(pb.HealthRequest(), timeout=5, metadata=A).serving
    print("ok: the right token works")

    geo = pb.Geometry(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=DIM, dtype=pb.DTYPE_F32)
    forged = "tenant-a\n2099-01-01T00:00:00.000Z I kv-store: forged line"
    sid = kv.OpenSession(pb.OpenSessionRequest(geometry=geo, shards=[pb.Shard(layer=0, kv_head=0)], client=forged),
                         timeout=5, metadata=A).session_id
    assert len(sid) == 16

    def chunk(begin, n, value=0.25, nan_at=None):
        vals = [value] * (n * DIM)
        if nan_at is not None:
            vals[nan_at] = float("nan")
        data = struct.pack(f"<{n * DIM}f", *vals)
        return pb.KvChunk(session_id=sid, layer=0, kv_head=0, token_begin=begin, n_tokens=n, keys=data, values=data)

    r = kv.PutKv(iter([chunk(0, 10)]), timeout=5, metadata=A)
    assert r.tokens_stored == 10, r
    q = struct.pack(f"<{2 * DIM}f", *([0.1] * 2 * DIM))
    attend = pb.AttendRequest(session_id=sid, layer=0, q_heads=[0, 1], q=q, mode=pb.MODE_FULL, seq=1)
    rep = next(kv.Attend(iter([attend]), timeout=5, metadata=A))
    assert len(rep.heads) == 2 and rep.heads[0].n_keys == 10, rep
    print("ok: tenant A writes and attends its session")
    for what, fn in (
            ("another credential attends", lambda: next(kv.Attend(iter([attend]), timeout=5, metadata=B))),
            ("another credential appends",
             lambda: kv.Append(pb.AppendRequest(session_id=sid, chunks=[chunk(10, 1)]), timeout=5, metadata=B)),
            ("another credential puts", lambda: kv.PutKv(iter([chunk(10, 1)]), timeout=5, metadata=B)),
            ("another credential closes",
             lambda: kv.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=5, metadata=B))):
        expect(grpc.StatusCode.PERMISSION_DENIED, fn, what, "another credential")
    sb = kv.Stats(pb.StatsRequest(), timeout=5, metadata=B)
    sa = kv.Stats(pb.StatsRequest(), timeout=5, metadata=A)
    assert sb.sessions == 0 and sb.tokens == 0 and sb.bytes_used == 0, sb
    assert sa.sessions == 1 and sa.tokens == 10, sa
    print("ok: Stats show each credential its own sessions")

    # ---- input safety
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: kv.PutKv(iter([chunk(10, 4, nan_at=9)]), timeout=5, metadata=A),
           "a NaN key", "not finite")
    expect(grpc.StatusCode.INVALID_ARGUMENT,
           lambda: kv.Append(pb.AppendRequest(session_id=sid, chunks=[chunk(10, 1, value=float("inf"))]), timeout=5,
                             metadata=A), "an infinite append", "not finite")
    big = pb.AttendRequest(session_id=sid, layer=0, q_heads=[0], q=q[:DIM * 4], mode=pb.MODE_FLAT, top_k=2**32 - 1, seq=1)
    expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: next(kv.Attend(iter([big]), timeout=5, metadata=A)),
           "top_k 2^32 - 1", "top_k")
    assert kv.Stats(pb.StatsRequest(), timeout=5, metadata=A).tokens == 10
    print("ok: nothing stored by the refused writes")

    # a PutKv cancelled after two chunks leaves nothing; the retry from the same start stores all
    gate = threading.Event()

    def chunks_then_hang():
        yield chunk(10, 5)
        yield chunk(15, 5)
        gate.wait(10)

    fut = kv.PutKv.future(chunks_then_hang(), timeout=10, metadata=A)
    time.sleep(0.5)
    fut.cancel()
    gate.set()
    time.sleep(0.3)
    assert kv.Stats(pb.StatsRequest(), timeout=5, metadata=A).tokens == 10
    r = kv.PutKv(iter([chunk(10, 5), chunk(15, 5)]), timeout=5, metadata=A)
    assert r.tokens_stored == 10 and kv.Stats(pb.StatsRequest(), timeout=5, metadata=A).tokens == 20
    print("ok: a cancelled PutKv left nothing; its retry stored every token")

    # ---- liveness: 100 silent streams (each on its own connection, as 100 clients)
    silent_done = queue.Queue()
    release = threading.Event()

    def silent():
        ch = grpc.secure_channel(st.addr, creds)
        stub = pbg.KvStoreStub(ch)
        t0 = time.monotonic()

        def nothing():
            release.wait(30)
            return
            yield

        try:
            for _ in stub.Attend(nothing(), timeout=30, metadata=A):
                pass
            silent_done.put(("ended", time.monotonic() - t0))
        except grpc.RpcError as e:
            silent_done.put((e.code(), time.monotonic() - t0))
        ch.close()

    threads = [threading.Thread(target=silent) for _ in range(100)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # every stream open and waiting at the store
    t0 = time.monotonic()
    assert kv.Health(pb.HealthRequest(), timeout=3, metadata=A).serving
    sid2 = kv.OpenSession(pb.OpenSessionRequest(geometry=geo, shards=[pb.Shard(layer=0, kv_head=0)], client="new"),
                          timeout=3, metadata=A).session_id
    took = time.monotonic() - t0
    assert took < 1.0, took
    print(f"ok: with 100 silent streams open, a new client's Health + OpenSession took {took * 1000:.0f} ms")
    for t in threads:
        t.join(30)
    release.set()
    ends = [silent_done.get() for _ in range(100)]
    assert all(c == grpc.StatusCode.DEADLINE_EXCEEDED for c, _ in ends), set(c for c, _ in ends)
    worst = max(s for _, s in ends)
    assert worst < FIRST_MESSAGE_MS / 1000 + 3, worst
    print(f"ok: every silent stream lost its slot (DEADLINE_EXCEEDED) within {worst:.1f} s "
          f"(--first-message-ms {FIRST_MESSAGE_MS})")

    # calls beyond --max-calls: MAX_CALLS Attend streams in service (a request answered, the
    # next awaited), then one more is refused at once
    att2 = pb.AttendRequest(session_id=sid2, layer=0, q_heads=[0], q=q[:DIM * 4], mode=pb.MODE_FULL, seq=1)
    held, stop = [], threading.Event()
    for i in range(MAX_CALLS):
        qq = queue.Queue()
        qq.put(att2)

        def reqs(qq=qq):
            yield qq.get()
            stop.wait(30)

        it = kv.Attend(reqs(), timeout=30, metadata=A)
        next(it)
        held.append(it)
    t0 = time.monotonic()
    expect(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: next(kv.Attend(iter([att2]), timeout=5, metadata=A)),
           f"a call beyond --max-calls {MAX_CALLS}", "--max-calls")
    assert time.monotonic() - t0 < 1.0
    stop.set()
    for it in held:
        for _ in it:
            pass
    assert kv.Health(pb.HealthRequest(), timeout=3, metadata=A).serving
    print("ok: once they end, calls are served again")

    log = st.stop()
    assert sid.hex() not in log and sid2.hex() not in log, "a full session id is in the log"
    assert sid.hex()[:8] in log, "the session's short tag is not in the log"
    assert "tenant-a\\x0a2099-01-01" in log, "the client name's newline is not escaped"
    for line in log.splitlines():
        assert not line.startswith("2099-"), f"a forged log line: {line}"
    print("ok: the log holds short session tags only and the client name's newline escaped")

    # ---- mutual TLS: a client certificate is required
    mt = Store("mtls", "--tls-cert", os.path.join(TMP, "server.pem"), "--tls-key", os.path.join(TMP, "server.key"),
               "--tls-ca", os.path.join(TMP, "ca.pem"))
    no_cert = pbg.KvStoreStub(grpc.secure_channel(mt.addr, creds))
    expect(grpc.StatusCode.UNAVAILABLE, lambda: no_cert.Health(pb.HealthRequest(), timeout=3),
           "mutual TLS without a client certificate")
    with_cert = pbg.KvStoreStub(grpc.secure_channel(mt.addr, grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"), private_key=read("client.key"), certificate_chain=read("client.pem"))))
    assert with_cert.Health(pb.HealthRequest(), timeout=5).serving
    print("ok: mutual TLS with the client certificate works")
    mt.stop()
    print("ok: trust")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
