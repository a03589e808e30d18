"""The real external programs the tests run, found or built on first use.

- prometheus, helm and kustomize: $FLOWSCHED_PROMETHEUS_BIN / $FLOWSCHED_HELM_BIN /
  $FLOWSCHED_KUSTOMIZE_BIN, else the one on PATH,
  else built from its Go module at a pinned version by build_go_tool.sh (cached outside the
  repository, like the Kubernetes binaries; see docs/testing.md).
- A Python with PyTorch (torch_python): $FLOWSCHED_TORCH_PYTHON, else a virtual environment
  made by build_torch_env.sh (cached outside the repository, keyed by torch's version).
- System commands (e.g. openssl): found on PATH, else installed with apt-get when this runs as
  root on a Debian-like machine, else the error names the exact command to run.

Results (and failures) are remembered for the session, so a tool that cannot be built fails
every test that needs it at once with the same reason instead of rebuilding for each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build_go_tool.sh")
TORCH_SCRIPT = Path(__file__).with_name("build_torch_env.sh")
GO_TOOLS = {"prometheus": "FLOWSCHED_PROMETHEUS_BIN", "helm": "FLOWSCHED_HELM_BIN",
            "kustomize": "FLOWSCHED_KUSTOMIZE_BIN"}
GO_HINT = ("install Go 1.26.7 or newer (https://go.dev/dl/: unpack it to /usr/local/go and put /usr/local/go/bin "
           "on PATH); Debian's golang-go package is too old for these modules")

_found: dict[str, str] = {}
_failed: dict[str, str] = {}


class ToolUnavailable(RuntimeError):
    pass


def go_tool(name: str) -> str:
    """The path of a runnable `name` (prometheus, helm or kustomize); builds it on first use."""
    return _remembered(name, lambda: _locate_or_build(name))


def torch_python() -> str:
    """An interpreter that imports torch (not a flowsched dependency): $FLOWSCHED_TORCH_PYTHON, else
    the cached environment build_torch_env.sh makes on first use."""
    return _remembered("torch", lambda: _override("FLOWSCHED_TORCH_PYTHON")
                       or _script_output([str(TORCH_SCRIPT)], timeout_s=1800))


def _remembered(name: str, locate: Callable[[], str]) -> str:
    """locate()'s path, or its failure, kept for the session."""
    if name in _found:
        return _found[name]
    if name in _failed:
        raise ToolUnavailable(_failed[name])
    try:
        path = locate()
    except ToolUnavailable as e:
        _failed[name] = str(e)
        raise
    _found[name] = path
    return path


def _override(env: str) -> str:
    """The executable $env names; "" when unset."""
    override = os.environ.get(env, "").strip()
    if override and not os.access(override, os.X_OK):
        raise ToolUnavailable(f"{env}={override} is not an executable file")
    return override


def _locate_or_build(name: str) -> str:
    env = GO_TOOLS[name]
    override = _override(env)
    if override:
        return override
    on_path = shutil.which(name)
    if on_path:
        return on_path
    if shutil.which("go") is None:
        raise ToolUnavailable(f"no {name} on PATH and no Go to build it with: {GO_HINT}; "
                              f"or point {env} at a {name} binary")
    return _script_output([str(BUILD_SCRIPT), name])


def _script_output(args: list[str], timeout_s: float = 3600) -> str:
    """Run `bash args...` (a build script) and return the executable path its last line prints."""
    what = "`bash " + " ".join(args) + "`"
    try:
        out = subprocess.run(["bash", *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise ToolUnavailable(f"{what} did not finish within {timeout_s:.0f} s") from e
    if out.returncode != 0:
        tail = "\n".join(out.stderr.splitlines()[-30:])
        raise ToolUnavailable(f"{what} failed (rc {out.returncode}):\n{tail}")
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not os.access(path, os.X_OK):
        raise ToolUnavailable(f"{what} printed {path!r}, which is not an executable")
    return path


def system_command(command: str, package: str) -> str:
    """The path of `command`, installing Debian package `package` with apt-get when root."""
    found = shutil.which(command)
    if found:
        return found
    exact = f"apt-get install -y --no-install-recommends {package}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ToolUnavailable(f"{command} is not installed; run: sudo {exact}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    r = subprocess.run(exact.split(), capture_output=True, text=True, env=env, check=False, timeout=900)
    if r.returncode != 0:  # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, check=False, timeout=900)
        r = subprocess.run(exact.split(), capture_output=True, text=True, env=env, check=False, timeout=900)
    found = shutil.which(command)
    if r.returncode != 0 or not found:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-10:])
        raise ToolUnavailable(f"{command} is not installed and `{exact}` failed (rc {r.returncode}):\n{tail}")
    return found


def go_module_dir(module: str, version: str) -> Path:
    """A Go module's source, read-only in Go's module cache (downloaded once)."""
    if shutil.which("go") is None:
        raise ToolUnavailable(f"reading {module}@{version} needs Go: {GO_HINT}")
    r = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                       timeout=900, check=False, env={**os.environ, "GOFLAGS": "-mod=mod"})
    try:
        info = json.loads(r.stdout)
    except ValueError:
        info = {}
    if r.returncode != 0 or not info.get("Dir"):
        raise ToolUnavailable(f"`go mod download {module}@{version}` failed: {info.get('Error') or r.stderr.strip()}")
    return Path(info["Dir"])
