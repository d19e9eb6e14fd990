# Here (CPU), before call CD: pydantic's wheels for the device's Python 3.12 (.whl_kgen); the tree
# before v106 (237acd3) as .ab/main.tgz with its sparse kernels (.kcache); this tree's sparse and
# DSA-pool kernels (.ab/kc_v106). All in .gitignore; ~45 MB with the tree. ~4 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .whl_kgen ] || for p in pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl_kgen "$p"; done
rm -rf .ab .kcache /tmp/cd_before && mkdir -p .ab /tmp/cd_before
git archive 237acd3 kgen templates bench specs pyproject.toml ":!bench/results" | tee .ab/main.tgz | tar xz -C /tmp/cd_before
(cd /tmp/cd_before && PYTHONPATH=$PWD python3 -m bench.warm "$OLDPWD/.kcache" --group sparse)
python3 -m bench.warm .ab/kc_v106 --group sparse --group dsa
du -sh .whl_kgen .kcache .ab
