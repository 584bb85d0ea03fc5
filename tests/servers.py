"""Real ``mlflow server`` processes for the tests, on 127.0.0.1 and a free port; the team
server's PostgreSQL 15 backend in a temporary directory (``Postgres``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ADMIN = ("admin", "admin-pass-8472")
PG_PASSWORD = "pg-pass-5531"  # the database's own password: the server holds it, never a client


class Postgres:
    """PostgreSQL (``initdb``/``pg_ctl`` on PATH) in a temporary directory on 127.0.0.1 and a
    free port, with the databases ``mlflow`` (tracking) and ``mlflow_auth`` (basic-auth users).
    As root it runs as user ``postgres`` (``runuser``), since PostgreSQL refuses root."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        initdb = shutil.which("initdb")
        if initdb is None:
            raise FileNotFoundError("initdb (PostgreSQL) is not on PATH")
        self.bin = Path(initdb).resolve().parent
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.dir: Path | None = None

    def uri(self, database: str = "mlflow") -> str:
        return f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def _run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*self.as_pg, *cmd], check=True, capture_output=True, timeout=120,
                              **kw)

    def start(self) -> "Postgres":
        self.dir = Path(tempfile.mkdtemp(prefix="fxtrack-pg-"))
        (self.dir / "pw").write_text(PG_PASSWORD + "\n")
        if self.as_pg:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(self.dir / "pw", "postgres", "postgres")
        data = self.dir / "data"
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8",
                  "--auth-host=scram-sha-256", "--auth-local=trust", f"--pwfile={self.dir / 'pw'}")
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "pg.log"), "-w",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")
        for db in ("mlflow", "mlflow_auth"):
            self._run(str(self.bin / "createdb"), "-h", str(self.dir), "-p", str(self.port),
                      "-U", "postgres", db)
        return self

    def dump(self) -> bytes:
        """Everything in the tracking and auth databases, as pg_dump writes it."""
        return b"".join(self._run(str(self.bin / "pg_dump"), "-h", str(self.dir), "-p",
                                  str(self.port), "-U", "postgres", db).stdout
                        for db in ("mlflow", "mlflow_auth"))

    def stop(self) -> None:
        if self.dir is None:
            return
        subprocess.run([*self.as_pg, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"),
                        "-m", "fast", "-w", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` with its own stores under ``root``; ``auth=True`` runs the basic-auth app."""

    def __init__(self, root: Path, port: int | None = None, auth: bool = False,
                 postgres: "Postgres | None" = None, workers: int = 2,
                 auth_cache_ttl_s: int = 0) -> None:
        self.root, self.port, self.auth, self.workers = root, port or free_port(), auth, workers
        # basic-auth's credential cache (MLflow >= 3.x, off by default): the password hash is
        # checked once per user per TTL instead of on every request
        self.auth_cache_ttl_s = auth_cache_ttl_s
        self.postgres = postgres  # the backend store; None: sqlite under root
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = 120) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow_bin = str(Path(sys.executable).with_name("mlflow"))
        store = self.postgres.uri() if self.postgres else f"sqlite:///{self.root / 'store.db'}"
        auth_db = (self.postgres.uri("mlflow_auth") if self.postgres
                   else f"sqlite:///{self.root / 'auth.db'}")
        cmd = [mlflow_bin, "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", store, "--serve-artifacts",
               "--artifacts-destination", str(self.root / "artifacts"),
               "--workers", str(self.workers)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        # no GenAI job runner (four huey consumers per server, ~1 GiB): fxtrack uses no jobs
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        if self.auth:
            ini = self.root / "auth.ini"
            ini.write_text(
                "[mlflow]\ndefault_permission = READ\n"
                f"database_uri = {auth_db}\n"
                f"admin_username = {ADMIN[0]}\nadmin_password = {ADMIN[1]}\n"
                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                f"auth_cache_ttl_seconds = {self.auth_cache_ttl_s}\n")
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
