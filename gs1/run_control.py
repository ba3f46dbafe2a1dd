"""What `gs1 run` holds while a flow runs: the run directory's lock, the Prefect API it talks to,
and how it stops on Ctrl-C or SIGTERM.

- Lock: one `gs1 run` per run directory (`.gs1-run.lock`, an flock the kernel drops when the holder
  dies however it dies); a second one is told who holds it. Only a gs1 run directory is taken
  (`.gs1-run-dir` marks one): a user's own folder is refused untouched.
- Prefect API: a configured `PREFECT_API_URL` must answer `/health` within `API_PROBE_S`;
  otherwise a temporary server is started as our child, with a parent-death signal so that it
  dies with `gs1 run` even after SIGKILL, and stopped when the run ends.
- Stop: SIGINT and SIGTERM are blocked in every thread and taken by one waiting thread, so
  neither Prefect's own SIGTERM handler nor a busy training thread can delay them. That thread
  says which stages were running, stops the server and ends the process at once: every artifact
  is written atomically and every finished stage is cached, so re-running resumes.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from schemas.errors import UserError
from schemas.layout import RunLayout

LOCK_FILE = ".gs1-run.lock"
API_PROBE_S = 6.0  # a configured Prefect API must answer /health within this
SERVER_START_S = 120.0  # a temporary server on a loaded 2-core machine can take a minute
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------------------------------------
# The run directory's lock


@contextmanager
def run_dir_lock(run_dir: Path):
    """Hold `<run_dir>/.gs1-run.lock` for the run; a UserError naming the holder if it is held.

    Only a gs1 run directory is taken (`RunLayout.claim`; one an earlier gs1 made before markers
    holds the lock file). The lock file goes when the run ends (a later holder checks that the file it locked
    is still the one at the path, so removing it never lets two runs in)."""
    RunLayout(run_dir).claim(legacy=LOCK_FILE)
    path = run_dir / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"--run-dir {run_dir}: cannot write the run directory ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{run_dir} is in use by another gs1 run ({_holder(path)}); wait for it to end or stop it") from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder before us removed the file we locked: lock the one there now
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        try:
            if _same_file(fd, path):
                path.unlink()  # while still held: a waiting opener finds its file gone and retries
        except OSError:
            pass
        os.close(fd)  # closing drops the lock (as the kernel does when the process dies)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


# ---------------------------------------------------------------------------------------------
# The Prefect API


def check_prefect_api(url: str, timeout: float = API_PROBE_S) -> None:
    """A configured Prefect API must answer `GET /health` within `timeout` s; else a UserError."""
    import httpx

    hint = "start it, or unset PREFECT_API_URL to run on a temporary server"
    try:
        response = httpx.get(url.rstrip("/") + "/health", timeout=httpx.Timeout(timeout / 2))
    except httpx.TimeoutException:
        raise UserError(f"the Prefect API at {url} (PREFECT_API_URL) did not answer within {timeout:g} s; {hint}") from None
    except httpx.HTTPError as e:
        raise UserError(f"the Prefect API at {url} (PREFECT_API_URL) is unreachable ({type(e).__name__}); {hint}") from None
    if response.status_code != 200:
        raise UserError(f"the Prefect API at {url} (PREFECT_API_URL) answered /health with HTTP {response.status_code}; {hint}")
    try:  # a Prefect server answers `true`; anything else (an HTML page, a proxy's text) is not one
        body = response.json()
    except ValueError:
        body = None
    if body is not True:
        shown = response.text[:40].replace("\n", " ")
        raise UserError(f"the Prefect API at {url} (PREFECT_API_URL) answered /health with {shown!r}, "
                        f"not a Prefect server's `true`; {hint}")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies, and the stop signals unblocked
    (a child inherits the parent's blocked-signal mask)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux/glibc: the server watches its parent instead
        pass
    os.setsid()  # out of the terminal's process group: Ctrl-C reaches gs1, which stops it in order


class TemporaryServer:
    """A Prefect API server for this run only (what Prefect's ephemeral mode starts, as our
    child: it dies with us). `launch` starts its process and returns at once, so that its start
    (its imports, uvicorn, the database) runs while `gs1 run` checks the data and the model;
    `start` waits until it answers."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.url = ""

    def launch(self) -> None:
        """Start the server's process, once; `start` waits for it."""
        if self.process is not None:
            return
        import prefect

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/api"
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1", "GS1_PARENT_PID": str(os.getpid())}
        env.pop("PREFECT_API_URL", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gs1.run_control", "serve", str(port), str(prefect.__module_path__.parent)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )

    def start(self) -> str:
        """The server's API URL once it answers `/health` (launched here if it was not)."""
        import httpx

        self.launch()
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (self.process.stderr.read() or b"").decode(errors="replace").strip().splitlines()
                raise RuntimeError(f"the temporary Prefect server exited ({err[-1] if err else self.process.returncode})")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the temporary Prefect server did not start within {SERVER_START_S:g} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _serve(port: int, app_dir: str) -> None:
    """The temporary server's process: uvicorn, plus a thread that ends it if `gs1 run` is gone
    (where the parent-death signal does not exist)."""
    parent = int(os.environ.get("GS1_PARENT_PID", "0"))

    def watch_parent():
        while True:
            time.sleep(1.0)
            if parent and os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    sys.path.insert(0, app_dir)
    import uvicorn

    uvicorn.run("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                log_level="error", lifespan="on")


# ---------------------------------------------------------------------------------------------
# Stopping on a signal


class StopOnSignal:
    """Takes SIGINT/SIGTERM in one thread: one line naming the stages that were running, the
    server stopped, and the process ended with 128 + the signal number."""

    def __init__(self, running_stages, cleanup):
        self.running_stages = running_stages  # () -> list of stage names
        self.cleanup = cleanup
        self._done = False
        self._thread: threading.Thread | None = None
        self._mask: set | None = None

    def __enter__(self):
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # this thread and every later one
        self._thread = threading.Thread(target=self._wait, name="gs1-stop-on-signal", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        # The run is over (in-process callers such as tests go on): wake the waiting thread
        # with a signal it ignores once done, then give this thread its signals back.
        self._done = True
        signal.pthread_kill(self._thread.ident, signal.SIGTERM)
        self._thread.join(timeout=5)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def _wait(self) -> None:
        signum = signal.sigwait(STOP_SIGNALS)
        if self._done:
            return
        try:
            import logging

            logging.disable(logging.CRITICAL)  # the line below is the last one on the terminal
            for handler in logging.getLogger().handlers + logging.getLogger("prefect").handlers:
                handler.flush()
            stages = self.running_stages()
            where = f"during {', '.join(stages)}" if stages else "between stages"
            sys.stderr.write(
                f"gs1: stopped by {signal.Signals(signum).name} {where}; run the same command again to resume "
                "(finished stages are kept, training resumes from its last checkpoint)\n"
            )
            sys.stderr.flush()
            # ... and it stays the last: a log record already past logging.disable in another
            # thread (Prefect's event worker losing its server, say) goes nowhere now.
            sys.stdout.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            self.cleanup()
        finally:
            os._exit(128 + signum)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "serve":
    _serve(int(sys.argv[2]), sys.argv[3])
