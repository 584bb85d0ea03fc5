"""Real ``mlflow server`` processes for the tests, on 127.0.0.1 and a free port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ADMIN = ("admin", "admin-pass-8472")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` with its own stores under ``root``; ``auth=True`` runs the basic-auth app."""

    def __init__(self, root: Path, port: int | None = None, auth: bool = False) -> None:
        self.root, self.port, self.auth = root, port or free_port(), auth
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = 120) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow_bin = str(Path(sys.executable).with_name("mlflow"))
        cmd = [mlflow_bin, "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", f"sqlite:///{self.root / 'store.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--workers", "2"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        if self.auth:
            ini = self.root / "auth.ini"
            ini.write_text(
                "[mlflow]\ndefault_permission = READ\n"
                f"database_uri = sqlite:///{self.root / 'auth.db'}\n"
                f"admin_username = {ADMIN[0]}\nadmin_password = {ADMIN[1]}\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
            cmd += ["--app-name", "basic-auth"]
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_FLASK_SERVER_SECRET_KEY="fxtrack-tests")
        self.log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not come up within {wait_s} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()

    def store_bytes(self) -> bytes:
        """Everything the server persisted (databases and artifacts), for secret scans."""
        data = b""
        for path in sorted(self.root.rglob("*")):
            if path.is_file() and path.name not in ("server.log", "auth.ini"):
                data += path.read_bytes()
        return data

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
