"""Installing from a checkout: the wheel holds the package and its console scripts, the Makefile reinstalls torch
when TORCH_SPEC or TORCH_INDEX change, and uv gets pip's sources."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checkout_files() -> list[str]:
    """The files a clean checkout of this working tree would hold (tracked or not ignored, and present)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (ROOT / name).is_file()]


def copy_checkout(dest: Path) -> None:
    for name in checkout_files():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


def test_pip_wheel_from_a_clean_checkout_holds_the_package_and_entry_points(tmp_path: Path) -> None:
    source, out = tmp_path / "src", tmp_path / "dist"
    copy_checkout(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(out), str(source)], check=True, capture_output=True, timeout=120)
    (wheel,) = out.glob("asyncrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {n for n in checkout_files() if n.startswith("asyncrl/") and n.endswith(".py")}
    assert modules and not modules - names, sorted(modules - names)
    assert not {n for n in names if n.startswith("tests/")}
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    text = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for line in setup["options.entry_points"]["console_scripts"].strip().splitlines():
        assert line.strip().replace(" ", "") in text.replace(" ", ""), line
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    for extra in setup["options.extras_require"]:
        assert f"Provides-Extra: {extra}" in metadata


def test_pip_install_from_a_clean_checkout_installs_the_console_scripts(tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "site"
    copy_checkout(source)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=120)
    assert (target / "asyncrl" / "config.py").is_file() and (target / "asyncrl" / "cli" / "train.py").is_file()
    scripts = {p.name for p in (target / "bin").iterdir()}
    assert {"asyncrl-train", "asyncrl-compare", "asyncrl-export"} <= scripts


def _fake_venv(path: Path) -> Path:
    """A venv whose python only logs its arguments, with an install stamp newer than the Makefile's inputs."""
    log = path / "calls.log"
    (path / "bin").mkdir(parents=True)
    python = path / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    python.chmod(0o755)
    (path / ".torch-spec").write_text("torch==2.13.0 \n")
    (path / ".installed-stamp").write_text("")
    return log


def test_make_install_reinstalls_torch_when_its_spec_changes(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    log = _fake_venv(venv)
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "TORCH_INDEX", "MAKEFLAGS", "MFLAGS")}

    def make(*extra: str) -> str:
        subprocess.run(["make", "-s", "install", f"VENV={venv}", *extra], cwd=ROOT, check=True, capture_output=True,
                       env=environ, timeout=60)
        return log.read_text() if log.exists() else ""

    assert make() == ""  # the same spec: nothing to do
    calls = make("TORCH_SPEC=torch==2.13.0+cu128", "TORCH_INDEX=https://download.pytorch.org/whl/cu128")
    assert "pip install -q --upgrade --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0+cu128" in calls
    assert (venv / ".torch-spec").read_text().split() == ["torch==2.13.0+cu128",
                                                          "https://download.pytorch.org/whl/cu128"]
    # without an index and without uv (this venv has none), pip installs the spec from its own configuration
    calls = make("TORCH_SPEC=torch==2.13.0+cpu")[len(calls):]
    assert "pip install -q --upgrade torch==2.13.0+cpu" in calls and "--index-url" not in calls, calls
    assert "scripts/uv_sources.py" not in calls  # uv's sources are asked for only where uv is there


def test_uv_is_given_pips_find_links_and_constraints() -> None:
    """`make install` hands uv the sources pip is configured with (scripts/uv_sources.py), so uv installs the
    torch build pip would: the files of pip's find-links, under pip's constraints."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from uv_sources import uv_flags
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    listing = ("global.cert='/etc/ssl/certs/ca.crt'\n"
               "global.constraint='/etc/pip/constraints.txt'\n"
               "global.find-links='/opt/wheels /srv/more wheels'\n"
               ":env:.find-links='/opt/wheels'\n"
               "global.extra-index-url='file:///opt/pypi/simple'\n")
    assert uv_flags(listing) == ["--constraint", "/etc/pip/constraints.txt", "--find-links", "/opt/wheels",
                                 "--find-links", "/srv/more", "--find-links", "wheels"]
    assert uv_flags("") == [] and uv_flags("global.timeout='60'\n") == []
    # the script itself, against this machine's pip: one flag per value, each a known option
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "uv_sources.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert len(out) % 2 == 0 and set(out[::2]) <= {"--find-links", "--constraint"}, out
