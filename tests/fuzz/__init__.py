"""A field-aware fuzzer for model files: mutators.py (what it changes), seeds.py (the valid files
it starts from), runner.py (the fork server and the outcome classes). tests/test_fuzz.py runs a
few hundred cases in CI; `python -m tests.fuzz --cases 20000 --out summary.json` is the long run."""
