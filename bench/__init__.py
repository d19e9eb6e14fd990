"""kgen's benchmark (DESIGN §9): `python -m bench.run --spec SPEC [--quick]` or `kgen bench SPEC`."""
