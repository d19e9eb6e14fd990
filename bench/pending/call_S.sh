# Call S (prepared in the thirty-fifth session, no device was lent then): v84, v85 and v86 against main,
# bench.sparse on the sm_90 plan, 2 rounds. Set-up here (bench/NOTES.md v86 says why the chain):
#   git archive HEAD kgen templates bench specs pyproject.toml ":!bench/results" | gzip > .ab/main.tgz
#   git apply bench/pending/v84-*.patch && tar czf .ab/v84.tgz --exclude=__pycache__ --exclude=bench/results kgen templates bench specs pyproject.toml
#   git apply bench/pending/v85-*.patch && tar czf .ab/v85.tgz --exclude=__pycache__ --exclude=bench/results kgen templates bench specs pyproject.toml
#   git apply bench/pending/v86-*.patch   (the working tree, "change")
# carry .ab and .whl_kgen; ~8 min with the start.
set -u
mkdir -p "$OUT"; t0=$SECONDS
AB_MODULE=bench.sparse AB_TREES="main v84 v85" timeout 540 bash bench/gpu_ab.sh sparse 2 --spec specs/glm5_dsa_sm120.yaml --time-limit 30
echo "ab: $((SECONDS - t0)) s" >> "$OUT/summary.log"
