"""Facts about the host and software behind a run, read without importing any framework.

Both the MLflow writer and the ``mlflow.run_context_provider`` plugin take their tags from here.
Every reader is best-effort: a fact that cannot be read is left out, never guessed.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, MutableMapping
from urllib.parse import unquote, urlsplit

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
# Up to the authority's last '@' (a raw '@' in a password left its tail behind), never past
# where the authority ends (/ ? # whitespace, a quote or an HTML bracket).
_URI_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s'\"<>]+@")
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


def redact_uri_text(text: str) -> str:
    """``text`` (a URI, or any text holding URIs) with every ``scheme://user:password@``'s
    credentials removed. THE redaction of fxtrack: every URI that reaches a page, a link, an
    artifact, a traceback, a log line, a Hydra output or a terminal line goes through it."""
    return _URI_CREDENTIALS.sub(r"\1", text)


def redact_file(path: Path) -> None:
    """Rewrite the text file ``path`` with its URI credentials removed, whole (a reader never
    sees half a file); a file without any, or none at all, is left as it is."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return
    redacted = redact_uri_text(text)
    if redacted != text:
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        part.write_text(redacted)
        part.replace(path)


class _RedactingStream:
    """A text stream whose writes go through redact_uri_text; the rest is the stream's own."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_uri_text(text) if "@" in text else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def redact_process_output() -> None:
    """From now on, this process's terminal lines (stdout, stderr: prints, tracebacks, Hydra's
    --cfg, MLflow's and Hydra's log handlers) and every log record (Hydra's job log file too)
    carry no URI credentials, whichever code wrote them: a URI with a password can come from a
    preset or a DB store, not only the command line that secure_process cleans (issue 60)."""
    import logging

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _RedactingStream):
            setattr(sys, name, _RedactingStream(stream))
    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def redacting(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: logging reports it itself
            return record
        if "@" in text:
            record.msg, record.args = redact_uri_text(text), ()
        if record.exc_info and not record.exc_text:  # the traceback a handler would format
            record.exc_text = redact_uri_text(logging.Formatter().formatException(record.exc_info))
        return record

    redacting.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting)


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the kernel sends ``sig`` to the child when the thread that
    started it dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, int(sig))


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
    return redact_uri_text(uri)


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
