# Here (CPU), before call BX: pydantic's wheels (.whl_kgen), main's kernel cache (.kcache) and, from
# the patches beside this file, the two trees call BX times against main (.ab/onecopy.tgz, .ab/ldg.tgz)
# with their caches (.ab/kc_onecopy, .ab/kc_ldg). Every cache is trimmed to the product spec's kernels
# (glm5_dsa_sm120, both plans) so that all of it fits the device tool's 64 MiB carry. ~6 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl_kgen/' .git/info/exclude 2>/dev/null || printf '/.whl_kgen/\n/.ab/\n' >> .git/info/exclude
[ -d .whl_kgen ] || for p in pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl_kgen "$p"; done
trim() { python3 - "$@" <<'PY'
import json, shutil, sys
from pathlib import Path
for root in sys.argv[1:]:
    for meta in Path(root).glob("v1/*/*/meta.json"):
        if "h8_d576_ps64_e4m3f16_pb_t64" not in json.loads(meta.read_text())["variant_id"]:
            shutil.rmtree(meta.parent)
PY
}
rm -rf .kcache .ab && mkdir -p .ab
python3 -m bench.warm .kcache --group sparse
for t in onecopy:onecopy-probe ldg:v103-ldgsts; do
    name=${t%%:*} patch=bench/pending/${t#*:}.patch dir=/tmp/bx_tree_$name
    rm -rf "$dir" && git worktree add -q --detach "$dir" HEAD
    git -C "$dir" apply "$PWD/$patch"
    (cd "$dir" && git add -A && git -c user.name=bx -c user.email=bx@kgen commit -qm "$name" \
        && git archive HEAD kgen templates bench specs pyproject.toml ":!bench/results" | gzip > "$OLDPWD/.ab/$name.tgz" \
        && PYTHONPATH=$PWD python3 -m bench.warm "$OLDPWD/.ab/kc_$name" --group sparse)
    git worktree remove --force "$dir"
done
trim .kcache .ab/kc_onecopy .ab/kc_ldg
du -sh .whl_kgen .kcache .ab
