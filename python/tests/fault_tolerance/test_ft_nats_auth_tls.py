"""Frontend and workers end to end on an external nats-server that requires
authentication and TLS, the way a cluster past one machine is deployed.

The server is a real nats-server process (built from go.mod's module by
python/tests/harness/nats.py) with a CA, a server certificate for 127.0.0.1 and
a client certificate made here with the openssl command. Two deployments:

- user and password in the URL (``tls://user:pass@host:port``) plus NATS_CA;
- user and password in NATS_USER/NATS_PASSWORD plus NATS_CA, with the server
  also requiring a client certificate (NATS_CERT/NATS_KEY).

In both, completions run token-exact and a cancelled stream's abort is
confirmed; processes without the credentials, without the CA or speaking plain
``nats://`` are refused with a clear error, at once.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness import NatsServer, run_python

USER, PASSWORD = "dcuser", "s3cret-pass"
REFUSAL_BOUND = 15.0  # a refused connection must fail well within this (it takes well under a second)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dc-test-ca",
             "-keyout", "ca-key.pem", "-out", "ca.pem", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=dc-test-{name}",
                 "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
                 "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)
    return d


def _server(certs: Path, verify_clients: bool, log_dir: Path) -> NatsServer:
    conf = f"""
tls {{
  cert_file: "{certs / 'server.pem'}"
  key_file: "{certs / 'server-key.pem'}"
  ca_file: "{certs / 'ca.pem'}"
  verify: {'true' if verify_clients else 'false'}
  timeout: 5
}}
authorization {{
  user: "{USER}"
  password: "{PASSWORD}"
}}
"""
    return NatsServer(config=conf, scheme="tls", log_dir=log_dir).start()


def _connect_attempt(env: dict) -> subprocess.CompletedProcess:
    """A process that only connects a runtime and reports; returns its result."""
    code = (
        "from dynamo_ctx import DistributedRuntime\n"
        "try:\n"
        "    rt = DistributedRuntime()\n"
        "except Exception as e:\n"
        "    print('REFUSED', type(e).__name__, e)\n"
        "else:\n"
        "    print('CONNECTED'); rt.shutdown()\n"
    )
    return run_python("-c", code, env=env)


def _clean_env(stack) -> dict:
    env = dict(stack.env)
    for k in ("NATS_SERVER", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY",
              "NATS_CA", "NATS_CERT", "NATS_KEY"):
        env.pop(k, None)
    return env


def _traffic(stack) -> None:
    """Completions token-exact on every worker, and a cancelled stream confirmed."""
    fe = stack.frontend
    client = fe.openai()
    for i in range(6):
        prompt = f"tls prompt {i}"
        out = client.completions.create(model=stack.model, prompt=prompt, max_tokens=8)
        assert out.choices[0].text == stack.expected_text(prompt, 8)
    f0 = fe.metrics()
    w0 = {w.name: w.metrics() for w in stack.workers}
    rid = stack.new_id("tls-cancel")
    stream = client.completions.create(model=stack.model, prompt="a long one", max_tokens=5000, stream=True,
                                       extra_headers={"x-request-id": rid})
    n = 0
    for _ in stream:
        n += 1
        if n == 3:
            break
    stream.close()
    served = [w for w in stack.workers if w.log_count(rf"New Request ID: {rid}$")]
    assert len(served) == 1
    stack.assert_cancelled(served[0], rid, w0[served[0].name], f0)


@pytest.mark.parametrize("deployment", ["url-credentials", "env-credentials+client-cert"])
def test_frontend_and_workers_on_nats_with_auth_and_tls(stack, certs, deployment):
    verify = deployment != "url-credentials"
    server = _server(certs, verify_clients=verify, log_dir=stack.log_dir)
    try:
        env = _clean_env(stack)
        env["NATS_CA"] = str(certs / "ca.pem")
        if verify:
            env.update(NATS_SERVER=server.url, NATS_USER=USER, NATS_PASSWORD=PASSWORD,
                       NATS_CERT=str(certs / "client.pem"), NATS_KEY=str(certs / "client-key.pem"))
        else:
            env["NATS_SERVER"] = f"tls://{USER}:{PASSWORD}@127.0.0.1:{server.port}"
        stack.env.clear()
        stack.env.update(env)
        stack.start([{"mode": "agg"}, {"mode": "agg", "decode": 0.01}], migration_limit=0)
        _traffic(stack)

        # Strangers are refused at once with a clear error: no credentials; no CA;
        # plain nats:// to a TLS server; (with client verification) no client certificate.
        base = _clean_env(stack)
        cases = {
            "no credentials": dict(
                base,
                NATS_SERVER=server.url,
                NATS_CA=str(certs / "ca.pem"),
                **({"NATS_CERT": str(certs / "client.pem"), "NATS_KEY": str(certs / "client-key.pem")} if verify else {}),
            ),
            "wrong password": dict(
                base,
                NATS_SERVER=f"tls://{USER}:nope@127.0.0.1:{server.port}",
                NATS_CA=str(certs / "ca.pem"),
                **({"NATS_CERT": str(certs / "client.pem"), "NATS_KEY": str(certs / "client-key.pem")} if verify else {}),
            ),
            "no CA": dict(base, NATS_SERVER=f"tls://{USER}:{PASSWORD}@127.0.0.1:{server.port}"),
            "plain nats://": dict(base, NATS_SERVER=f"nats://{USER}:{PASSWORD}@127.0.0.1:{server.port}"),
        }
        if verify:
            cases["no client certificate"] = dict(
                base, NATS_SERVER=server.url, NATS_USER=USER, NATS_PASSWORD=PASSWORD, NATS_CA=str(certs / "ca.pem")
            )
        for what, e in cases.items():
            t0 = time.monotonic()
            r = _connect_attempt(e)
            took = time.monotonic() - t0
            assert "REFUSED" in r.stdout, f"{what}: {r.stdout!r} {r.stderr[-2000:]!r}"
            assert took < REFUSAL_BOUND, f"{what}: refused only after {took:.1f} s"
            assert "Traceback" not in r.stderr, f"{what}: {r.stderr[-2000:]}"
            assert PASSWORD not in r.stdout + r.stderr, f"{what}: the password is in the error"
            hint = {
                "no credentials": "none were given",
                "wrong password": "refused our credentials",
                "no CA": "certificate",
                "plain nats://": "tls",
            }.get(what, "tls")
            assert hint in r.stdout, f"{what}: no hint {hint!r} in {r.stdout!r}"
        # The password never appears in an error or a log line.
        for p in stack.procs:
            assert PASSWORD not in p.log(), p.name
        # The rightful processes still serve after all that.
        out = stack.frontend.openai().completions.create(model=stack.model, prompt="after", max_tokens=4)
        assert out.choices[0].text == stack.expected_text("after", 4)
    finally:
        server.stop()
