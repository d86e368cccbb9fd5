"""What a non-editable install ships: a wheel built from this tree's sdist (as `python -m
build` and `pip install livemeet-*.tar.gz` build it), unpacked on its own (no checkout beside
it), holds every file of the package, serves the recorder page and the captions overlay and
finds its kernel source. The pages lay at the checkout's root, outside the package: `pip
install .` (a container image, say) served no page at all, and `GET /` answered 404."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the installed package reads at run time, relative to its directory
SHIPPED = ("web/index.html", "web/captions.html", "web/recorder.js", "layers/csrc")


def build(src: Path, *args: str) -> None:
    """Run `args` (python's) in `src`, a build step that must pass."""
    built = subprocess.run(
        [sys.executable, *args], cwd=src, capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, built.stderr


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the sdist of a copy of the sources (a build writes build/ and
    *.egg-info beside them), unpacked into a directory of its own: a file the sdist leaves
    out is missing from it too."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "livemeet", src / "livemeet", ignore=ignore)
    # the PEP 517 hook pip's build front ends call (the `build` package is not a dependency)
    hook = "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])"
    build(src, "-c", hook, str(tmp / "sdist"))
    (sdist,) = (tmp / "sdist").glob("livemeet-*.tar.gz")
    # tar filters came in 3.11.4; 3.12 and later warn without one
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", **safe)  # type: ignore[arg-type]
    (from_sdist,) = (tmp / "unpacked").glob("livemeet-*")
    build(
        from_sdist, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "-w", str(tmp / "dist"), ".",
    )  # fmt: skip
    (wheel,) = (tmp / "dist").glob("livemeet-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def package_files() -> list[str]:
    """The files of this tree's livemeet/, relative to the root: git's list in a checkout
    (a scratch file left in it is none of the package's), else every file but bytecode."""
    listed = subprocess.run(
        ["git", "ls-files", "livemeet"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if listed.returncode == 0 and listed.stdout.strip():
        return [name for name in listed.stdout.split("\n") if (ROOT / name).is_file()]
    files = (ROOT / "livemeet").rglob("*")
    return [
        p.relative_to(ROOT).as_posix()
        for p in files
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    ]


def test_a_wheel_built_from_the_sdist_holds_every_file_of_the_package(
    unpacked_wheel: Path,
) -> None:
    """Package data is declared by pattern (pyproject.toml's package-data): a data file that
    no pattern names (a header beside the .cu kernel, a page in a folder of web/) would be
    left out of the sdist and the wheel, and read at run time from the checkout only."""
    missing = [name for name in package_files() if not (unpacked_wheel / name).is_file()]
    assert not missing, f"not in the wheel (pyproject.toml package-data): {missing}"


def test_a_wheel_ships_every_page_the_gateway_serves(unpacked_wheel: Path) -> None:
    web = ROOT / "livemeet" / "web"
    pages = sorted(p.name for p in web.iterdir() if p.is_file())
    assert "index.html" in pages and "captions.js" in pages
    shipped = unpacked_wheel / "livemeet" / "web"
    assert sorted(p.name for p in shipped.iterdir()) == pages
    for name in pages:
        assert (shipped / name).read_bytes() == (web / name).read_bytes(), name


def test_the_installed_package_serves_its_pages_away_from_the_checkout(
    unpacked_wheel: Path, tmp_path: Path
) -> None:
    """The installed package, imported from the unpacked wheel in another directory (the
    checkout off the path), routes `/` and each page, and its kernel source is there."""
    probe = (
        "import json, livemeet, livemeet.gateway.app as app\n"
        "from pathlib import Path\n"
        "pkg = Path(livemeet.__file__).parent\n"
        "print(json.dumps({'pkg': str(pkg), 'web': str(app.WEB_DIR),\n"
        "    'pages': sorted(p.name for p in app.WEB_DIR.glob('*')),\n"
        f"    'shipped': [(pkg / p).exists() for p in {SHIPPED!r}]}}))\n"
    )
    env = {"PYTHONPATH": str(unpacked_wheel), "PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.splitlines()[-1])
    assert Path(seen["pkg"]).is_relative_to(unpacked_wheel)  # not the checkout's
    assert Path(seen["web"]).is_relative_to(unpacked_wheel)
    assert "index.html" in seen["pages"] and "captions.html" in seen["pages"]
    assert all(seen["shipped"]), dict(zip(SHIPPED, seen["shipped"], strict=True))
