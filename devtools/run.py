"""`make run`: start everything the gateway needs on this machine, stop it all on Ctrl-C.

1. PostgreSQL: ``DATABASE_URL`` if set, else the embedded server (started here, stopped on exit).
2. Migrations, the first-run operator bootstrap (credentials file path printed), the signing key.
3. The upstream: ``UPSTREAM_MCP_URL`` if set, else the bundled demo upstream on 127.0.0.1
   (``DEMO_UPSTREAM_PORT``, default 8765), priced and with a demo tenant on first run.
4. ``sync_tools``, then gunicorn on 127.0.0.1:$PORT (default 8000), the dispatch sweeper, the
   approvers' webhook sender (``deliver_webhooks``) and the transparency log's integrator
   (``tlog_integrate``).

Ports are checked before anything is written: a gateway ``PORT`` that another program holds, or a
``DEMO_UPSTREAM_PORT`` given and taken, stops the run with what is wrong; the default demo port,
taken, is replaced by a free one (said so). Another program answering on the demo port was taken
for the demo upstream, its tools synced and demo credentials written (docs/decisions.md, "Running it").
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from devtools import pg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, check=True)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the demo upstream exited (is port {port} taken? set DEMO_UPSTREAM_PORT)")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"the demo upstream did not start on port {port}")


DEFAULT_DEMO_UPSTREAM_PORT = 8765


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (a bind succeeds)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_setting(env: dict[str, str], name: str, default: int) -> int:
    text = env.get(name, str(default))
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise SystemExit(f"make run: {name}={text!r} is not a port number (1-65535).")
    return int(text)


def choose_ports(env: dict[str, str], *, demo: bool) -> tuple[int, int | None]:
    """The gateway's port and the demo upstream's (None without the demo), checked before anything is
    written. A taken gateway port, or a taken ``DEMO_UPSTREAM_PORT`` that was asked for, stops the run
    with the reason; the default demo port, taken, gives way to a free port."""
    port = _port_setting(env, "PORT", 8000)
    if not port_free(port):
        raise SystemExit(
            f"make run: port {port} on 127.0.0.1 is already in use by another program, so the gateway cannot "
            f"serve there. Stop that program or choose another port: PORT=8001 make run. Nothing was changed."
        )
    if not demo:
        return port, None
    demo_port = _port_setting(env, "DEMO_UPSTREAM_PORT", DEFAULT_DEMO_UPSTREAM_PORT)
    if port_free(demo_port) and demo_port != port:
        return port, demo_port
    if "DEMO_UPSTREAM_PORT" in env:
        raise SystemExit(
            f"make run: DEMO_UPSTREAM_PORT={demo_port} is already in use on 127.0.0.1 (by another program, or it "
            f"is the gateway's PORT); the demo upstream cannot start there. Choose a free port, or leave "
            f"DEMO_UPSTREAM_PORT unset to have one picked. Nothing was changed."
        )
    chosen = free_port()
    print(
        f"Port {demo_port} (the demo upstream's default) is in use by another program; "
        f"the demo upstream uses port {chosen} instead (set DEMO_UPSTREAM_PORT to choose).",
        flush=True,
    )
    return port, chosen


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    # SIGTERM (from a supervisor or `timeout`) stops everything just like Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    env = dict(os.environ)
    demo = not env.get("UPSTREAM_MCP_URL")
    port_number, demo_port_number = choose_ports(env, demo=demo)  # before anything is started or written
    started_db = False
    if not env.get("DATABASE_URL"):
        print("Starting embedded PostgreSQL (.data/postgres) ...", flush=True)
        was_running = pg.running_url() is not None
        env["DATABASE_URL"] = pg.start()
        started_db = not was_running
    port = str(port_number)
    env.setdefault("PUBLIC_BASE_URL", f"http://127.0.0.1:{port}")
    env.setdefault("ALLOWED_ORIGINS", f"http://127.0.0.1:{port},http://localhost:{port}")
    children: list[subprocess.Popen[bytes]] = []
    try:
        print("Applying migrations ...", flush=True)
        _manage("migrate", "--no-input", "-v", "0", env=env)
        _manage("bootstrap_operator", env=env)
        _manage("ensure_signing_key", env=env)
        if demo:
            demo_port = str(demo_port_number)
            env["UPSTREAM_MCP_URL"] = f"http://127.0.0.1:{demo_port}/mcp"
            print(f"Starting the bundled demo upstream MCP server on 127.0.0.1:{demo_port} ...", flush=True)
            children.append(
                subprocess.Popen([PY, "-m", "mcpgateway.demo_upstream", "--port", demo_port], cwd=ROOT, env=env)
            )
            _wait_for_port(int(demo_port), children[-1])
        print(f"Syncing tools from {env['UPSTREAM_MCP_URL']} ...", flush=True)
        _manage("sync_tools", "--server", "default", env=env)  # the others sync from the console
        if demo:
            _manage("demo_bootstrap", env=env)
        children.append(subprocess.Popen([PY, "manage.py", "sweep_dispatches", "--loop"], cwd=ROOT, env=env))
        children.append(subprocess.Popen([PY, "manage.py", "deliver_webhooks", "--loop"], cwd=ROOT, env=env))
        # The transparency log's integrator: indexes, hashes and signs each tenant's checkpoint (tlog app).
        children.append(subprocess.Popen([PY, "manage.py", "tlog_integrate"], cwd=ROOT, env=env))
        workers = env.get("WEB_CONCURRENCY", "2")
        threads = env.get("GUNICORN_THREADS", "4")
        children.append(
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "gunicorn",
                    "-c",
                    "python:config.gunicorn",
                    "config.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    workers,
                    "--threads",
                    threads,
                    "--access-logfile",
                    "-",
                    "--limit-request-line",
                    "16384",
                    "--graceful-timeout",
                    "10",
                ],
                cwd=ROOT,
                env=env,
            )
        )
        print(
            f"\nTollgate is serving on http://127.0.0.1:{port}  (docs: /docs, admin: /admin/, approvals: /approvals/)."
            + ("\nDemo agent key and permit: .data/demo-credentials.json (see README)." if demo else "")
            + "\nCtrl-C stops everything.\n",
            flush=True,
        )
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        return next(child.returncode for child in children if child.poll() is not None) or 1
    except KeyboardInterrupt:
        print("\nStopping ...", flush=True)
        return 0
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        if started_db:
            pg.stop()
            print("Embedded PostgreSQL stopped.", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
