"""Headless Chromium for page tests: Debian's `chromium` package, a screenshot and the DOM.

When no chromium is on PATH the tooling installs the Debian package itself if it runs as root
or has password-less sudo (apt-get), otherwise the test fails with the exact command to run. Each call uses its own
throw-away profile directory, so parallel sessions do not fight over a profile lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

INSTALL_CMD = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium"
_NAMES = ("chromium", "chromium-browser")


def _found() -> str | None:
    env = os.environ.get("FLOWSCHED_CHROMIUM_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    return next((p for p in map(shutil.which, _NAMES) if p), None)


def chromium_binary() -> str:
    """The chromium binary; installs the Debian package when root and it is missing."""
    found = _found()
    if found:
        return found
    if os.environ.get("FLOWSCHED_CHROMIUM_BIN"):
        pytest.fail(f"FLOWSCHED_CHROMIUM_BIN={os.environ['FLOWSCHED_CHROMIUM_BIN']} is not an executable",
                    pytrace=False)
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    can_sudo = not sudo or (shutil.which("sudo") is not None
                            and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0)
    if not can_sudo or not shutil.which("apt-get"):
        pytest.fail(f"the status-page test needs headless Chromium and none was found; run as root: {INSTALL_CMD} "
                    "(or set FLOWSCHED_CHROMIUM_BIN)", pytrace=False)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=600",
               "chromium"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:  # stale package lists on a fresh machine
        subprocess.run([*sudo, "apt-get", "update"], env=env, capture_output=True, text=True, timeout=600)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    found = _found()
    if done.returncode != 0 or not found:
        pytest.fail(f"installing chromium failed (exit {done.returncode}): {done.stderr[-2000:]}; "
                    f"run: {INSTALL_CMD}", pytrace=False)
    return found


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="flowsched-chromium-") as profile:
        argv = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def screenshot(url: str, path: Path, width: int = 1400, height: int = 1600, timeout_s: float = 120.0) -> Path:
    done = _run([f"--screenshot={path}", f"--window-size={width},{height}", url], timeout_s)
    if not path.exists() or path.stat().st_size == 0:
        raise AssertionError(f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}")
    return path


def dump_dom(url: str, timeout_s: float = 120.0) -> str:
    """The DOM after the page loaded, serialised (what a browser shows, not the raw bytes)."""
    done = _run(["--dump-dom", url], timeout_s)
    if done.returncode != 0 or "<html" not in done.stdout:
        raise AssertionError(f"chromium --dump-dom failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return done.stdout
