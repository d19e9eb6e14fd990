# Here (CPU), before call CA: pydantic's wheels for the device's Python 3.12 (.whl_kgen) and main's
# sparse kernels compiled (.kcache, ~16 MiB; both in .gitignore). ~3 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .whl_kgen ] || for p in pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl_kgen "$p"; done
rm -rf .kcache && python3 -m bench.warm .kcache --group sparse
du -sh .whl_kgen .kcache
