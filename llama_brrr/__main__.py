"""`python -m llama_brrr ...` is the `llama-brrr` command."""

import sys

from .cli import main

sys.exit(main())
