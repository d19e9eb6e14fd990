# Call AE (prepared in the thirty-eighth session): the sm_120 plan's batched union loop (the product's)
# under ncu, as call AD did the sm_90 plan's (s38a: e4m3 conversions are a third of that loop's issue):
# B32 L32768 T16, per-SASS samples and instruction mix. Any card; carry .whl_kgen; ~1.5 min warm.
set -u
source bench/pending/steps.sh
step ncu_b32_sm120 150 ncu --clock-control none --cache-control none --set full --import-source no \
    -k regex:sparse_verify --launch-skip 1 -c 1 -f -o /tmp/ncu_b32_sm120 \
    python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 32,16,32768 --calls 3 --plan-arch sm_120
ncu -i /tmp/ncu_b32_sm120.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_b32_sm120_sass.csv" 2>&1
gzip -f "$OUT/ncu_b32_sm120_sass.csv"
