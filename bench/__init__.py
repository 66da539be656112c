"""headscope benchmarks: `python -m bench [--quick|--tiny]` (see bench/README.md)."""
