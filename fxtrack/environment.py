"""Facts about the host and software behind a run, read without importing any framework.

Both the MLflow writer and the ``mlflow.run_context_provider`` plugin take their tags from here.
Every reader is best-effort: a fact that cannot be read is left out, never guessed.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Callable, Mapping, MutableMapping
from urllib.parse import unquote, urlsplit, urlunsplit

import fxtrack

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|PASSPHRASE|TOKEN(?!IZERS)|SECRET|KEY|CREDENTIAL|AUTH"
                         r"|COOKIE|SESSION|PRIVATE|DSN", re.IGNORECASE)
# Variables worth recording in environment.json: what changes how a framework computes or where
# it runs. An allowlist, because a denylist of secret names misses the next one (issue 14).
# TensorFlow's own variables by their families, not all of TF_*: Terraform puts its inputs and
# tokens in TF_VAR_*, TF_TOKEN_*, TF_CLI_* (issue 25, item 11).
_RECORDED = re.compile(
    r"^(CUDA_|NVIDIA_|CUDNN_|CUBLAS_|NCCL_|XLA_|JAX_|TORCH|PYTORCH_|OMP_|MKL_|KMP_|OPENBLAS_"
    r"|TF_(CPP|XLA|ENABLE|DISABLE|GPU|FORCE|NUM|CUDNN|USE|MKL|ONEDNN|DETERMINISTIC|AUTOTUNE"
    r"|DUMP|INTER_OP|INTRA_OP|ALLOW|SYNC|PER_DEVICE|KERAS)_|TF_CONFIG$|TF2_BEHAVIOR$"
    r"|ONEDNN_|DNNL_|HIP_|ROCR_|TPU_|FXTRACK_|HYDRA_FULL_ERROR$|PYTHONHASHSEED$|LD_PRELOAD$"
    r"|SLURM_(JOB_ID|JOB_NAME|NNODES|NTASKS|NTASKS_PER_NODE|NODEID|PROCID|LOCALID|CPUS_PER_TASK"
    r"|GPUS|GPUS_PER_NODE|JOB_NUM_NODES)$|MLFLOW_(TRACKING_URI|REGISTRY_URI|EXPERIMENT_NAME"
    r"|EXPERIMENT_ID|RUN_ID|S3_ENDPOINT_URL|HTTP_REQUEST_\w+)$)")
# scheme://user[:password]@ inside any text; the scheme may carry a driver (postgresql+psycopg2).
_URI_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s'\"]+@")
# Values that look like a credential whatever their variable is called: well-known token
# formats (GitHub, GitLab, Slack, AWS, OpenAI/Anthropic-style keys, JWTs, PEM keys), a
# secret-named option inside a value (--password=x, token: x), and long random-looking strings.
_TOKEN_VALUE = re.compile(
    r"(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|xox[abposr]-[\w-]{10,}"
    r"|A[KS]IA[A-Z0-9]{16}|sk-[\w-]{20,}|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]*"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$))")
_SECRET_OPTION = re.compile(
    r"((?:PASSWORD|PASSWD|PASS|PWD|TOKEN|SECRET|API_?KEY|ACCESS_?KEY|CREDENTIALS?|AUTH)"
    r"[\w.-]*\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)", re.IGNORECASE)
# (a word of 24+ letters and digits mixing cases and digits; not a path part; a hyphenated
# id such as a GPU UUID has shorter words)
_RANDOM_LOOKING = re.compile(r"(?<![\w/.+=])(?=[\w+=]*[a-z])(?=[\w+=]*[A-Z])(?=[\w+=]*\d)"
                             r"[\w+=]{24,}(?![\w/.+=])")


def redact_uri(uri: str) -> str:
    """A URI with any user:password@ removed, safe to log."""
    parts = urlsplit(uri)
    try:
        if parts.username is None and parts.password is None:
            return uri
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # an unparsable netloc: fall back to the textual rule
        return redact_uri_text(uri)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_uri_text(text: str) -> str:
    """``text`` with any ``scheme://user:password@`` credentials removed."""
    return _URI_CREDENTIALS.sub(r"\1", text)


def redact_credentials(text: str) -> str:
    """``text`` without URI credentials and without anything that looks like a token, a key
    or a secret-named option's value (each replaced by ``***``)."""
    text = _TOKEN_VALUE.sub("***", redact_uri_text(text))
    text = _SECRET_OPTION.sub(lambda m: m.group(1) + "***", text)
    return _RANDOM_LOOKING.sub("***", text)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-named variables (4+ characters), longest first, for scrubbing text."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= 4}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` without URI credentials and without the value of any secret-named variable of
    ``environ`` (default: this process's): for logs that leave the machine (worker.log)."""
    for value in secret_values(environ):
        text = text.replace(value, "***")
    return redact_uri_text(text)


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: ``environ`` without secret-named variables and without the
    credentials of any URI. The worker never talks to MLflow, so it needs none of them."""
    return {k: redact_uri_text(v) for k, v in environ.items() if not SECRET_NAME.search(k)}


def move_uri_credentials(uri: str, environ: MutableMapping[str, str] | None = None) -> str:
    """``uri`` without ``user:password@``; the credentials go to MLFLOW_TRACKING_USERNAME /
    MLFLOW_TRACKING_PASSWORD of ``environ`` (default: this process's), where MLflow reads them.
    Variables already set win: an explicit environment is the documented way."""
    environ = os.environ if environ is None else environ
    parts = urlsplit(uri)
    try:
        user, password = parts.username, parts.password
    except ValueError:
        return redact_uri_text(uri)
    if user is None and password is None:
        return uri
    if user:
        environ.setdefault("MLFLOW_TRACKING_USERNAME", unquote(user))
    if password:
        environ.setdefault("MLFLOW_TRACKING_PASSWORD", unquote(password))
    return redact_uri(uri)


def secure_process(argv: list[str], environ: MutableMapping[str, str] | None = None) -> None:
    """Before anything prints or logs: move credentials out of ``tracking.uri=...`` overrides
    in ``argv`` (edited in place, so Hydra never sees them) and out of $MLFLOW_TRACKING_URI
    into MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD."""
    environ = os.environ if environ is None else environ
    if environ.get("MLFLOW_TRACKING_URI"):
        environ["MLFLOW_TRACKING_URI"] = move_uri_credentials(environ["MLFLOW_TRACKING_URI"],
                                                              environ)
    for i, arg in enumerate(argv):
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+~") == "tracking.uri" and "@" in value:
            uris = [move_uri_credentials(v, environ) for v in value.split(",")]
            argv[i] = f"{key}={','.join(uris)}"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _git_commit() -> str:
    repo = Path(fxtrack.__file__).resolve().parent.parent
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                         text=True, timeout=5, check=True)
    return out.stdout.strip()


def _nvidia_driver() -> str:
    """The NVIDIA kernel driver's version, from procfs (no NVML import, no GPU context)."""
    text = Path("/proc/driver/nvidia/version").read_text()
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return match.group(1) if match else ""


_READERS: dict[str, Callable[[], str]] = {
    "fxtrack.cpu": _cpu_model,
    "fxtrack.host": platform.node,
    "fxtrack.python": platform.python_version,
    "fxtrack.version": lambda: fxtrack.__version__,
    "fxtrack.git_commit": _git_commit,
    "fxtrack.driver": _nvidia_driver,
    "fxtrack.slurm_job_id": lambda: os.environ.get("SLURM_JOB_ID", ""),  # a SLURM job's own id
}


@functools.lru_cache(maxsize=1)
def host_tags() -> dict[str, str]:
    """Hardware/software tags of this host (docs/contract.md#tags); unreadable facts are dropped."""
    tags = {}
    for key, read in _READERS.items():
        try:
            value = read()
        except Exception:  # noqa: BLE001 - a fact we cannot read is simply absent
            continue
        if value:
            tags[key] = str(value)[:5000]
    return tags


def environment_snapshot() -> dict[str, object]:
    """What goes into environment.json: host facts and the allowlisted variables, every value
    with URI credentials and credential-looking values removed, no secret-named variable at
    all."""
    env = {k: redact_credentials(v) for k, v in sorted(os.environ.items())
           if _RECORDED.match(k) and not SECRET_NAME.search(k)}
    return {"host": host_tags(), "platform": platform.platform(), "environment": env}
