"""What a non-editable install ships: a wheel built from this tree, unpacked on its own (no
checkout beside it), serves the recorder page and the captions overlay and finds its kernel
source. The pages lay at the checkout's root, outside the package: `pip install .` (a
container image, say) served no page at all, and `GET /` answered 404."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the installed package reads at run time, relative to its directory
SHIPPED = ("web/index.html", "web/captions.html", "web/recorder.js", "layers/csrc")


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a copy of the sources (a build writes build/ and *.egg-info beside them),
    unpacked into a directory of its own."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "livemeet", src / "livemeet", ignore=ignore)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("livemeet-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


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
