import os

# Tests are CPU-only and must not oversubscribe the machine's cores across ranks.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def no_process_group_left_behind():
    """A test that starts a process group in this process (an FSDPStrategy without a
    launcher starts a 1-rank one) destroys it, so that later tests see a single process."""
    import torch.distributed as torch_dist

    before = torch_dist.is_available() and torch_dist.is_initialized()
    yield
    if not before and torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


@pytest.fixture(scope="module")
def outside_the_repository(tmp_path_factory):
    """The module's tests (and the ranks and commands they start) run in a temporary
    directory: for runs whose work_dir is a URL, whose logs go to ``./work_dirs``.
    ``pytestmark = pytest.mark.usefixtures("outside_the_repository")``."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


# ----------------------------------------------------------------------------- leftovers
# Tests leave nothing in the repository: what they write goes under their tmp_path (a run whose
# work_dir is a URL keeps its logs in ./work_dirs, so such tests run in a temporary directory).
# Checked over the whole session: a file that git does not track and that was not there when
# the session started fails it, named. The tools' own folders are not the tests' doing, nor
# is a source file that git does not track yet (a developer's new module or test).
_TOOLING = {".venv", ".pytest_cache", ".ruff_cache", ".hypothesis", ".openmmlab", ".whl"}
_SOURCE = (".py", ".md", ".sh", ".toml", ".cfg", ".txt", ".json", ".yaml", ".yml")


def repository_leftovers() -> set[str]:
    """The files in the repository that git does not track (ignored ones included), the
    tools' folders (virtual environment, caches, ``__pycache__``, ``*.egg-info``) aside."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    found = set()
    for line in status.stdout.splitlines():
        if line[:2] not in ("??", "!!"):
            continue
        path = line[3:].strip('"')
        if _is_tooling(Path(path).parts):
            continue
        files = [path]
        if path.endswith("/"):
            files = [
                f.relative_to(repo).as_posix() for f in (repo / path).rglob("*") if f.is_file()
            ]
        untracked_source = line[:2] == "??"
        for file in files:
            if _is_tooling(Path(file).parts) or (untracked_source and file.endswith(_SOURCE)):
                continue
            found.add(file)
    return found


def _is_tooling(parts: tuple[str, ...]) -> bool:
    return bool(parts) and (
        parts[0] in _TOOLING
        or "__pycache__" in parts
        or any(part.endswith(".egg-info") for part in parts)
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = repository_leftovers()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    left = sorted(repository_leftovers() - before)
    if left:
        shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the tests left {len(left)} file(s) in the repository: {shown}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set]()
