"""The metrics/health endpoint: a busy port is named; a client hanging up is not a traceback (issue 27)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from epu.common.observability import HealthServer, ServiceMetrics

ROOT = Path(__file__).resolve().parents[2]


def test_a_port_in_use_is_named_with_its_service(tmp_path: Path) -> None:
    """Before: "a port is already in use ([Errno 98] Address already in use)", naming neither."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port}, the metrics_port of the decision service"):
            HealthServer(ServiceMetrics("decision"), dict, "127.0.0.1", port)
        cfg = tmp_path / "epu.toml"
        cfg.write_text(f'[broker]\nurl = "amqp://guest:guest@127.0.0.1:1/x"\n'
                       f'[decision]\nstore_url = "sqlite:///{tmp_path}/d.db"\nmetrics_port = {port}\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
        env["PYTHONPATH"] = str(ROOT)
        res = subprocess.run([sys.executable, "-m", "epu", "run", "decision", "-c", str(cfg)], capture_output=True,
                             text=True, timeout=60, env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (f"epu: a port is already in use: Address already in use: "
                                                   f"127.0.0.1:{port}, the metrics_port of the decision service")


def test_a_client_that_hangs_up_is_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """Before: BrokenPipeError/ConnectionResetError tracebacks on stderr ("Exception occurred
    during processing of request") whenever a probe gave up before the answer was written."""
    asked, answer = threading.Event(), threading.Event()

    def health() -> dict:
        asked.set()
        answer.wait(10)
        return {"healthy": True, "pad": "x" * 200_000}

    server = HealthServer(ServiceMetrics("probe-test"), health, "127.0.0.1", 0).start()
    try:
        for _ in range(3):
            asked.clear()
            answer.clear()
            client = socket.create_connection(("127.0.0.1", server.port))
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert asked.wait(10)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, before the answer is written
            answer.set()
        with socket.create_connection(("127.0.0.1", server.port)) as ok:  # and it still answers
            ok.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert ok.recv(100).startswith(b"HTTP/1.0 200")
    finally:
        server.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err
